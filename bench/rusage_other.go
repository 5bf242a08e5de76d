//go:build !unix

package main

import (
	"errors"
	"time"
)

// selfCPU is not available outside Unix: the bench column reads n/a.
func selfCPU() (time.Duration, error) { return 0, errors.New("getrusage: not supported here") }
