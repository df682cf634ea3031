//go:build !linux

package bench

import "os"

// oDSync makes each write return once it is on the disk: O_SYNC where Go has no O_DSYNC.
const oDSync = os.O_SYNC
