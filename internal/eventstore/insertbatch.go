package eventstore

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

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

// InsertBatch collects events for one EventInsertBatch statement.
type InsertBatch struct {
	community []uuid.UUID
	id        [][]byte
	pubkey    [][]byte
	createdAt []int64
	kind      []int32
	tags      []string
	content   []string
	sig       [][]byte
	channel   []*uuid.UUID
	dTag      []*string
	expiresAt []*int64
}

// Add appends one event's row (as InsertParams builds it).
func (b *InsertBatch) Add(p db.EventInsertParams) {
	b.community = append(b.community, p.CommunityID)
	b.id = append(b.id, p.ID)
	b.pubkey = append(b.pubkey, p.Pubkey)
	b.createdAt = append(b.createdAt, p.CreatedAt)
	b.kind = append(b.kind, p.Kind)
	b.tags = append(b.tags, string(p.Tags))
	b.content = append(b.content, p.Content)
	b.sig = append(b.sig, p.Sig)
	b.channel = append(b.channel, p.ChannelID)
	b.dTag = append(b.dTag, p.DTag)
	b.expiresAt = append(b.expiresAt, p.ExpiresAt)
}

// Len is the number of rows added.
func (b *InsertBatch) Len() int { return len(b.id) }

// Queue queues the statement on batch. Read its result with ReadStored.
func (b *InsertBatch) Queue(batch *pgx.Batch) {
	batch.Queue(insertBatchSQL, b.community, b.id, b.pubkey, b.createdAt, b.kind,
		b.tags, b.content, b.sig, b.channel, b.dTag, b.expiresAt)
}

// ReadStored reads the statement's result from results and reports, per
// added row in order, whether it was stored. Of two copies of one event in
// the batch the first is the stored one (the second met it as a conflict).
func (b *InsertBatch) ReadStored(results pgx.BatchResults) ([]bool, error) {
	rows, err := results.Query()
	if err != nil {
		return nil, err
	}
	type key struct {
		community uuid.UUID
		id        string
	}
	inserted := map[key]bool{}
	for rows.Next() {
		var k key
		var id []byte
		if err := rows.Scan(&k.community, &id); err != nil {
			rows.Close()
			return nil, err
		}
		k.id = string(id)
		inserted[k] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	stored := make([]bool, b.Len())
	for i := range stored {
		k := key{b.community[i], string(b.id[i])}
		if inserted[k] {
			stored[i] = true
			delete(inserted, k) // a later copy in the batch was the conflict
		}
	}
	return stored, nil
}
