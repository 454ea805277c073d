// Package localport picks TCP ports for the servers the relay's dev mode
// and tests start themselves (PostgreSQL, redis-server).
package localport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// Free returns a port on 127.0.0.1 that nothing listens on, outside the
// kernel's ephemeral range where it can. A port the kernel handed out
// for 127.0.0.1:0 is in that range, and once its server stops (a restart,
// a test stopping PostgreSQL and starting it again) the kernel may give it
// to any outgoing connection of any process meanwhile: the restart then
// finds it taken. Below the range only a server binding it by number
// takes it.
func Free() (int, error) {
	if low, ok := ephemeralLow(); ok && low > belowEphemeralFrom+1 {
		for range 100 {
			port := belowEphemeralFrom + rand.IntN(low-belowEphemeralFrom)
			if free(port) {
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// belowEphemeralFrom is the first port Free draws below the ephemeral
// range: above the ports services listen on by default (PostgreSQL's
// 5432, redis's 6379).
const belowEphemeralFrom = 10000

func free(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// ephemeralLow is the first port of Linux's ephemeral range.
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	var low, high int
	if _, err := fmt.Sscan(string(b), &low, &high); err != nil {
		return 0, false
	}
	return low, true
}
