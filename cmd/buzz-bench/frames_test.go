package main

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// serverFrame builds an unmasked frame of the given first byte and payload,
// with the shortest length encoding unless long forces the 64-bit one.
func serverFrame(first byte, payload []byte, long bool) []byte {
	b := []byte{first}
	switch n := len(payload); {
	case long || n > 0xffff:
		b = append(b, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	case n > 125:
		b = append(b, 126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, byte(n))
	}
	return append(b, payload...)
}

// Every length encoding parses, frames back to back come out one at a
// time, and a frame not yet whole asks for more bytes.
// Mutations killed: a 16- or 64-bit length read from the wrong bytes; a
// partial frame returned as whole; the size not counting the header.
func TestNextFrameLengthsAndPartialInput(t *testing.T) {
	t.Parallel()
	small := []byte(`["EOSE","live"]`)
	medium := bytes.Repeat([]byte("m"), 300)
	large := bytes.Repeat([]byte("l"), 70000)
	var stream []byte
	stream = append(stream, serverFrame(0x80|opText, small, false)...)
	stream = append(stream, serverFrame(0x80|opText, medium, false)...)
	stream = append(stream, serverFrame(0x80|opText, large, false)...)
	stream = append(stream, serverFrame(0x80|opPing, []byte("hi"), true)...)
	var got [][]byte
	for len(stream) > 0 {
		for cut := range min(len(stream), 12) {
			_, size, err := nextFrame(stream[:cut])
			require.NoError(t, err)
			require.Zero(t, size, "a frame cut after %d bytes is not whole", cut)
		}
		f, size, err := nextFrame(stream)
		require.NoError(t, err)
		require.NotZero(t, size)
		_, short, err := nextFrame(stream[:size-1])
		require.NoError(t, err)
		require.Zero(t, short, "one byte short is not whole")
		got = append(got, append([]byte{f.opcode}, f.payload...))
		stream = stream[size:]
	}
	require.Equal(t, [][]byte{
		append([]byte{opText}, small...), append([]byte{opText}, medium...),
		append([]byte{opText}, large...), append([]byte{opPing}, "hi"...),
	}, got)
}

// Frames the relay never sends are errors, not misread data.
// Mutation killed: any of these checks removed.
func TestNextFrameRefusesWhatTheRelayNeverSends(t *testing.T) {
	t.Parallel()
	for name, frame := range map[string][]byte{
		"masked":      {0x80 | opText, 0x80 | 1, 1, 2, 3, 4, 'x'},
		"fragmented":  serverFrame(opText, []byte("part"), false),
		"compressed":  serverFrame(0x80|0x40|opText, []byte("x"), false),
		"too large":   serverFrame(0x80|opText, nil, true)[:2:2],
		"big control": serverFrame(0x80|opPing, bytes.Repeat([]byte("p"), 126), false),
	} {
		if name == "too large" {
			frame = binary.BigEndian.AppendUint64(frame, maxFrame+1)
		}
		_, _, err := nextFrame(frame)
		require.Error(t, err, name)
	}
}

// A pong is a final, masked pong frame whose payload unmasks to the ping's.
// Mutation killed: the payload sent unmasked, or the mask bit missing.
func TestPongFrameIsMasked(t *testing.T) {
	t.Parallel()
	key := [4]byte{0xa1, 0xb2, 0xc3, 0xd4}
	frame := pongFrame([]byte("ping payload"), key)
	require.Equal(t, byte(0x80|opPong), frame[0])
	require.Equal(t, byte(0x80|len("ping payload")), frame[1])
	require.Equal(t, key[:], frame[2:6])
	unmasked := make([]byte, len(frame)-6)
	for i, c := range frame[6:] {
		unmasked[i] = c ^ key[i%4]
	}
	require.Equal(t, "ping payload", string(unmasked))
	require.NotEqual(t, "ping payload", string(frame[6:]))
}
