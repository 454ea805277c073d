package eventstore

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// BenchmarkInsertBatchEncode is the relay's CPU for one group's multi-row
// insert before it is sent: each event's row (InsertParams, its tags as
// JSON), the batch, and pgx encoding the eleven array parameters in binary,
// as a connection does (one pgtype.Map, its plans cached).
func BenchmarkInsertBatchEncode(b *testing.B) {
	const groupSize = 8
	community, channel := uuid.New(), uuid.New()
	sk, err := nostr.GenerateSecretKey()
	if err != nil {
		b.Fatal(err)
	}
	events := make([]*nostr.Event, groupSize)
	for i := range events {
		ev := &nostr.Event{CreatedAt: 1_700_000_000 + int64(i), Kind: 1, Content: "lorem ipsum dolor sit amet, a note of about this size",
			Tags: nostr.Tags{{"t", "bench"}, {"e", "5c83da77af1dec6d7289834998ad7aafbd9e2191396d75ec3cc27f5a77226f36", "wss://relay.example", "root"}}}
		if i%2 == 1 {
			ev.Kind = 30023
			ev.Tags = append(ev.Tags, nostr.Tag{"d", "slot"}, nostr.Tag{"expiration", "1800000000"})
		}
		if err := ev.Sign(sk); err != nil {
			b.Fatal(err)
		}
		events[i] = ev
	}
	oids := []uint32{pgtype.UUIDArrayOID, pgtype.ByteaArrayOID, pgtype.ByteaArrayOID, pgtype.Int8ArrayOID, pgtype.Int4ArrayOID,
		pgtype.TextArrayOID, pgtype.TextArrayOID, pgtype.ByteaArrayOID, pgtype.UUIDArrayOID, pgtype.TextArrayOID, pgtype.Int8ArrayOID}
	m := pgtype.NewMap()
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		rows := NewInsertBatch(len(events))
		for i, ev := range events {
			var ch *uuid.UUID
			if i%4 == 0 {
				ch = &channel
			}
			p, err := InsertParams(community, ev, ch)
			if err != nil {
				b.Fatal(err)
			}
			rows.Add(p)
		}
		var batch pgx.Batch
		rows.Queue(&batch)
		args := batch.QueuedQueries[0].Arguments
		if len(args) != len(oids) {
			b.Fatalf("%d arguments, want %d", len(args), len(oids))
		}
		for i, arg := range args {
			var err error
			if buf, err = m.Encode(oids[i], pgtype.BinaryFormatCode, arg, buf[:0]); err != nil {
				b.Fatal(err)
			}
		}
	}
}
