package main

import (
	"os/exec"
	"syscall"
)

// setChildAttrs makes the kernel kill the child if this process dies (even by SIGKILL), and
// puts it in its own process group so a terminal's Ctrl-C reaches only us: we stop the
// children in order.
func setChildAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
