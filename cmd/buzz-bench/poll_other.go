//go:build !linux

package main

// poller reads subscribers together on Linux only; elsewhere each
// subscriber has its own reader goroutine.
type poller struct{}

func (p *poller) close() {}

func (g *subscriberGroup) startPollers(string, *sendClock, *tally) bool { return false }
