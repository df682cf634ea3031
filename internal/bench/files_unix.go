//go:build unix

package bench

import (
	"fmt"
	"syscall"
)

// raiseFileLimit raises the process's soft limit on open files to its hard limit, and fails
// unless that allows need: a storm of N connections to servers in this process holds two
// descriptors per connection. It returns the limit now in force.
func raiseFileLimit(need uint64) (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return 0, fmt.Errorf("raise the open files limit to %d: %w", l.Max, err)
		}
	}
	if l.Cur < need {
		return l.Cur, fmt.Errorf("the storm needs %d open files, the hard limit is %d: raise it (ulimit -Hn, or LimitNOFILE= in a systemd unit) or pass a smaller --storm", need, l.Cur)
	}
	return l.Cur, nil
}
