package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The CPU of a /proc stat line is utime plus stime, counted after the
// command name even when the name holds spaces and parentheses.
// Mutations killed: fields counted from the start of the line; only one of
// utime and stime; ticks taken for milliseconds.
func TestProcCPU(t *testing.T) {
	t.Parallel()
	stat := []byte("4242 (buzz relay (dev)) S 1 4242 4242 0 -1 4194560 2411 0 0 0 1234 566 0 0 20 0 9 0 1111 0 0\n")
	got, err := procCPU(stat)
	require.NoError(t, err)
	require.Equal(t, 18*time.Second, got, "1234 + 566 ticks of 10 ms")
	_, err = procCPU([]byte("4242 (x) S 1 2"))
	require.Error(t, err)
}
