package bench

import "syscall"

// oDSync makes each write return once its data is on the disk.
const oDSync = syscall.O_DSYNC
