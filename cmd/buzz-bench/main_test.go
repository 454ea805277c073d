package main

import (
	"context"
	"net"
	"strings"
	"testing"
)

// An unreachable relay is reported before any scenario signs its supply.
// Mutation: run without checkReachable; every scenario then runs and fails
// on its own, and the report has no top-level error.
func TestUnreachableRelayStopsTheRunBeforeAnyScenario(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	o, err := parseFlags([]string{"-url", "ws://" + addr, "-scenario", "all", "-duration", "1s"})
	if err != nil {
		t.Fatal(err)
	}
	rep := run(context.Background(), o)
	if rep.Error == "" || !strings.Contains(rep.Error, addr) || !rep.failed() {
		t.Fatalf("report error %q, failed %v: want the unreachable URL named", rep.Error, rep.failed())
	}
	s := rep.Scenarios
	if s.Publish != nil || s.AfterBurst != nil || s.Shapes != nil || s.Fanout != nil {
		t.Fatalf("scenarios ran against an unreachable relay: %+v", s)
	}
}
