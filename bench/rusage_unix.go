//go:build unix

package main

import (
	"fmt"
	"syscall"
	"time"
)

// selfCPU returns this process's CPU time so far (user + system, all threads).
func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
