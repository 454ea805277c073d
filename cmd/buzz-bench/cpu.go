package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// cpuReport is the CPU the relay and this load generator spent while the
// fan-out events were published and delivered, per delivery: on a machine
// where both share the cores, what each side costs. The relay's is read
// from /proc, so it must run on this machine (-relay-pid).
type cpuReport struct {
	RelayUSPerDelivery float64 `json:"relay_us_per_delivery,omitempty"`
	BenchUSPerDelivery float64 `json:"bench_us_per_delivery"`
	Error              string  `json:"error,omitempty"`
}

// userHZ is the unit of the times in /proc/<pid>/stat on Linux.
const userHZ = 100

// procCPU returns the user plus system time of a /proc/<pid>/stat line.
func procCPU(stat []byte) (time.Duration, error) {
	// The command name, in parentheses, may contain spaces: fields count
	// from the last ')'.
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, errors.New("no command name in stat")
	}
	fields := bytes.Fields(stat[end+1:])
	// After the name: state(3) ... utime(14) stime(15), 1-based overall.
	const utime, stime = 14 - 3, 15 - 3
	if len(fields) <= stime {
		return 0, fmt.Errorf("stat has %d fields after the name", len(fields))
	}
	var ticks int64
	for _, f := range [...][]byte{fields[utime], fields[stime]} {
		n, err := strconv.ParseInt(string(f), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat time %q: %w", f, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

func readProcCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return procCPU(stat)
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter reads both processes' CPU at the start and at the end.
type cpuMeter struct {
	relayPID          int
	relayStart, start time.Duration
	err               error
}

func startCPU(relayPID int) *cpuMeter {
	m := &cpuMeter{relayPID: relayPID, start: selfCPU()}
	if relayPID != 0 {
		m.relayStart, m.err = readProcCPU(relayPID)
	}
	return m
}

// finish reports the CPU spent since start per delivery.
func (m *cpuMeter) finish(deliveries int) cpuReport {
	var rep cpuReport
	if deliveries <= 0 {
		return rep
	}
	perDelivery := func(d time.Duration) float64 {
		return roundMicros(float64(d.Microseconds()) / float64(deliveries))
	}
	rep.BenchUSPerDelivery = perDelivery(selfCPU() - m.start)
	if m.relayPID == 0 {
		return rep
	}
	relayEnd, err := readProcCPU(m.relayPID)
	if err == nil {
		err = m.err
	}
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	rep.RelayUSPerDelivery = perDelivery(relayEnd - m.relayStart)
	return rep
}

func roundMicros(v float64) float64 { return float64(int64(v*10+0.5)) / 10 }
