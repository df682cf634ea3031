package testkit

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// maxStretch bounds how far Stretched widens a bound: past it a slow step is a fault, not load.
const maxStretch = 4

// Stretched is d, a bound on wall-clock time a quiet machine meets, widened by how loaded the
// machine is now: the one-minute load average over the CPUs, between 1 and maxStretch. A step
// bounded by d (a reconnect, an election, a re-issue) gets a share of the CPUs that shrinks as
// the load grows, and a bound that holds only on a quiet machine fails the suite on a busy one
// without finding a fault. Where /proc/loadavg cannot be read, d is returned as is.
func Stretched(d time.Duration) time.Duration {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return d
	}
	fields := strings.Fields(string(raw))
	if len(fields) == 0 {
		return d
	}
	load, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return d
	}
	factor := min(max(load/float64(runtime.NumCPU()), 1), maxStretch)
	return time.Duration(float64(d) * factor).Round(time.Millisecond)
}
