//go:build !linux

package main

import "os/exec"

// setChildAttrs does nothing outside Linux: there is no parent-death signal, so children are
// stopped by the deferred cleanup and the signal handler only.
func setChildAttrs(*exec.Cmd) {}
