package main

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The few WebSocket frames a polled subscriber reads and writes itself,
// once its socket was taken from the WebSocket library (poll_linux.go).
// The relay runs without compression and sends each message in one frame.

const (
	opText  = 0x1
	opClose = 0x8
	opPing  = 0x9
	opPong  = 0xA
)

// wsFrame is one server-to-client frame; payload aliases the input.
type wsFrame struct {
	opcode  byte
	payload []byte
}

// maxControlPayload is the largest payload of a ping, pong or close.
const maxControlPayload = 125

// nextFrame parses the frame at the start of b. size is the frame's length
// in b, 0 while b does not yet hold all of it.
func nextFrame(b []byte) (f wsFrame, size int, err error) {
	if len(b) < 2 {
		return f, 0, nil
	}
	fin := b[0]&0x80 != 0
	if b[0]&0x70 != 0 {
		return f, 0, errors.New("frame with reserved bits set (compression is off)")
	}
	f.opcode = b[0] & 0x0f
	if b[1]&0x80 != 0 {
		return f, 0, errors.New("masked frame from the server")
	}
	n, header := uint64(b[1]&0x7f), 2
	switch n {
	case 126:
		if len(b) < 4 {
			return f, 0, nil
		}
		n, header = uint64(binary.BigEndian.Uint16(b[2:4])), 4
	case 127:
		if len(b) < 10 {
			return f, 0, nil
		}
		n, header = binary.BigEndian.Uint64(b[2:10]), 10
	}
	if n > maxFrame {
		return f, 0, fmt.Errorf("frame of %d bytes exceeds %d", n, maxFrame)
	}
	if !fin {
		return f, 0, errors.New("fragmented message; the relay sends each message in one frame")
	}
	if f.opcode >= opClose && n > maxControlPayload {
		return f, 0, fmt.Errorf("control frame of %d bytes", n)
	}
	if uint64(len(b)-header) < n {
		return f, 0, nil
	}
	size = header + int(n)
	f.payload = b[header:size]
	return f, size, nil
}

// pongFrame answers a ping carrying payload (at most maxControlPayload
// bytes). A client masks every frame it sends.
func pongFrame(payload []byte, key [4]byte) []byte {
	b := make([]byte, 0, 6+len(payload))
	b = append(b, 0x80|opPong, 0x80|byte(len(payload)))
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i%4])
	}
	return b
}
