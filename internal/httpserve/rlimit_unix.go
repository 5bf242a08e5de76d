//go:build unix

package httpserve

import "syscall"

// openFileLimit returns the process's soft limit on open files (Go raises it to the hard limit
// at start), or 0 when it is unknown or unlimited.
func openFileLimit() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur > 1<<30 {
		return 0
	}
	return int(r.Cur)
}
