//go:build !unix

package bench

import "time"

// cpuTime is 0 where the platform does not report the process's CPU time.
func cpuTime() time.Duration { return 0 }
