package eventstore

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/buzzrelay/buzz/internal/db"
)

// NameEventInsertBatch names the multi-row insert below.
const NameEventInsertBatch = "EventInsertBatch"

// insertBatchSQL is EventInsert for many events in one statement. PostgreSQL
// pays a large part of an events INSERT once per statement, whatever the
// number of rows: it opens and locks the table and its indexes, rebuilds the
// generated columns' and check constraints' expressions from the catalog.
// One statement per group of events pays that once. Rows are inserted in
// the given order (the ORDER BY), so the row triggers (the replaceable-slot
// rule, the write fence) see them exactly as they would see one INSERT per
// event in that order, and ON CONFLICT DO NOTHING skips a second copy
// inside the batch as it skips a stored one. RETURNING names the rows that
// were stored. Written here rather than in queries/ because sqlc cannot type
// a many-array unnest.
var insertBatchSQL = named(NameEventInsertBatch, `
INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id, d_tag, expires_at)
SELECT e.community_id, e.id, e.pubkey, to_timestamp(e.created_at), e.kind, e.tags::jsonb, e.content, e.sig, e.channel_id, e.d_tag, to_timestamp(e.expires_at)
FROM unnest($1::uuid[], $2::bytea[], $3::bytea[], $4::bigint[], $5::int[], $6::text[], $7::text[], $8::bytea[], $9::uuid[], $10::text[], $11::bigint[])
    WITH ORDINALITY AS e(community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id, d_tag, expires_at, ord)
ORDER BY e.ord
ON CONFLICT DO NOTHING
RETURNING community_id, id`)

// InsertBatch collects events for one EventInsertBatch statement. Its
// columns are arrays pgx encodes without reflection and without an
// allocation per element (see pgArray); slices of []byte, uuid.UUID or
// pointers went through pgx's reflection, a few percent of the relay's CPU
// under a publish load.
type InsertBatch struct {
	community pgArray[pgtype.UUID]
	id        pgArray[byteaElem]
	pubkey    pgArray[byteaElem]
	createdAt pgArray[pgtype.Int8]
	kind      pgArray[pgtype.Int4]
	tags      pgArray[pgtype.Text]
	content   pgArray[pgtype.Text]
	sig       pgArray[byteaElem]
	channel   pgArray[pgtype.UUID]
	dTag      pgArray[pgtype.Text]
	expiresAt pgArray[pgtype.Int8]
}

// NewInsertBatch returns a batch with room for n rows, so adding them
// allocates each column once rather than as it grows.
func NewInsertBatch(n int) *InsertBatch {
	return &InsertBatch{
		community: make(pgArray[pgtype.UUID], 0, n),
		id:        make(pgArray[byteaElem], 0, n),
		pubkey:    make(pgArray[byteaElem], 0, n),
		createdAt: make(pgArray[pgtype.Int8], 0, n),
		kind:      make(pgArray[pgtype.Int4], 0, n),
		tags:      make(pgArray[pgtype.Text], 0, n),
		content:   make(pgArray[pgtype.Text], 0, n),
		sig:       make(pgArray[byteaElem], 0, n),
		channel:   make(pgArray[pgtype.UUID], 0, n),
		dTag:      make(pgArray[pgtype.Text], 0, n),
		expiresAt: make(pgArray[pgtype.Int8], 0, n),
	}
}

// Add appends one event's row (as InsertParams builds it).
func (b *InsertBatch) Add(p db.EventInsertParams) {
	b.community = append(b.community, pgtype.UUID{Bytes: p.CommunityID, Valid: true})
	b.id = append(b.id, p.ID)
	b.pubkey = append(b.pubkey, p.Pubkey)
	b.createdAt = append(b.createdAt, pgtype.Int8{Int64: p.CreatedAt, Valid: true})
	b.kind = append(b.kind, pgtype.Int4{Int32: p.Kind, Valid: true})
	b.tags = append(b.tags, pgtype.Text{String: string(p.Tags), Valid: true})
	b.content = append(b.content, pgtype.Text{String: p.Content, Valid: true})
	b.sig = append(b.sig, p.Sig)
	var channel pgtype.UUID
	if p.ChannelID != nil {
		channel = pgtype.UUID{Bytes: *p.ChannelID, Valid: true}
	}
	b.channel = append(b.channel, channel)
	var dTag pgtype.Text
	if p.DTag != nil {
		dTag = pgtype.Text{String: *p.DTag, Valid: true}
	}
	b.dTag = append(b.dTag, dTag)
	var expiresAt pgtype.Int8
	if p.ExpiresAt != nil {
		expiresAt = pgtype.Int8{Int64: *p.ExpiresAt, Valid: true}
	}
	b.expiresAt = append(b.expiresAt, expiresAt)
}

// pgArray is a one-dimensional array parameter. pgx encodes an element that
// is one of its own value types (through its Valuer interface) by a plan it
// finds once per statement; Index hands out a pointer into the slice, which
// an interface holds without allocating.
type pgArray[T any] []T

func (a *pgArray[T]) Dimensions() []pgtype.ArrayDimension {
	if *a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(*a)), LowerBound: 1}}
}

func (a *pgArray[T]) Index(i int) any { return &(*a)[i] }

func (a *pgArray[T]) IndexType() any { return new(T) }

// byteaElem is a bytea array element; nil is NULL.
type byteaElem []byte

func (b *byteaElem) BytesValue() ([]byte, error) { return *b, nil }

// Len is the number of rows added.
func (b *InsertBatch) Len() int { return len(b.id) }

// Queue queues the statement on batch. Read its result with ReadStored.
func (b *InsertBatch) Queue(batch *pgx.Batch) {
	batch.Queue(insertBatchSQL, &b.community, &b.id, &b.pubkey, &b.createdAt, &b.kind,
		&b.tags, &b.content, &b.sig, &b.channel, &b.dTag, &b.expiresAt)
}

// ReadStored reads the statement's result from results and reports, per
// added row in order, whether it was stored. Of two copies of one event in
// the batch the first is the stored one (the second met it as a conflict).
func (b *InsertBatch) ReadStored(results pgx.BatchResults) ([]bool, error) {
	rows, err := results.Query()
	if err != nil {
		return nil, err
	}
	// The id is read from the connection's buffer (DriverBytes), not copied
	// out, and the map is keyed by fixed-size values: no allocation per row.
	type key struct {
		community [16]byte
		id        [32]byte
	}
	inserted := make(map[key]bool, b.Len())
	var community pgtype.UUID
	var id pgtype.DriverBytes
	for rows.Next() {
		if err := rows.Scan(&community, &id); err != nil {
			rows.Close()
			return nil, err
		}
		k := key{community: community.Bytes}
		if len(id) != len(k.id) {
			rows.Close()
			return nil, fmt.Errorf("event id of %d bytes", len(id))
		}
		copy(k.id[:], id)
		inserted[k] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	stored := make([]bool, b.Len())
	for i := range stored {
		k := key{community: b.community[i].Bytes}
		copy(k.id[:], b.id[i])
		if inserted[k] {
			stored[i] = true
			delete(inserted, k) // a later copy in the batch was the conflict
		}
	}
	return stored, nil
}
