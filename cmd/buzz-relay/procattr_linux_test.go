package main

import (
	"os/exec"
	"syscall"
)

// killWithParent has the kernel SIGKILL the relay process if the test
// binary dies without running its cleanups (a test timeout's panic, say),
// so no relay outlives its test.
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
