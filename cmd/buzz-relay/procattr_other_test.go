//go:build !linux

package main

import "os/exec"

// killWithParent: only Linux can tie a child's life to its parent's;
// elsewhere the tests' cleanups stop the relay processes.
func killWithParent(*exec.Cmd) {}
