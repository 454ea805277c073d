// Package interop drives the real relay (real PostgreSQL, real WebSocket on
// loopback) with Nostr client libraries written outside this project: the Go
// library go-nostr and the JavaScript library nostr-tools. Each test asserts
// what a client observes, so a relay that drifts from NIP-01/09/42/45 as
// these clients read the protocol fails here.
package interop

import (
	"testing"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }
