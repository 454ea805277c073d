// Package eventstore reads and writes the events table for the relay's two
// spines. Fixed statements are sqlc queries (internal/db); the filter reads
// that sqlc cannot express statically are built here by one small builder
// with bound parameters only.
package eventstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// Store serves filter reads from the pool it was given.
type Store struct {
	pool *pgxpool.Pool
	// MaxLimit caps every filter's limit (and is the default when none is given).
	MaxLimit int
}

// New returns a Store reading from pool.
func New(pool *pgxpool.Pool, maxLimit int) *Store {
	return &Store{pool: pool, MaxLimit: maxLimit}
}

// Query streams the stored events that match filters and that scope may
// see, newest first, to fn with each event's channel (nil: community-global).
// An event matched by several filters is delivered once.
func (s *Store) Query(ctx context.Context, community uuid.UUID, scope Scope, filters nostr.Filters, fn func(ev *nostr.Event, channel *uuid.UUID) error) error {
	sql, args, ok := BuildSelect(community, scope, filters, s.MaxLimit)
	if !ok {
		return nil
	}
	// Read every row before handing any to fn: fn may block on a slow client,
	// and a pooled connection must not wait on it. The result is bounded by
	// the filters' limits.
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	type row struct {
		ev      *nostr.Event
		channel *uuid.UUID
	}
	var found []row
	var seen map[string]struct{}
	if len(filters) > 1 {
		seen = make(map[string]struct{})
	}
	for rows.Next() {
		ev, channel, err := scanEvent(rows)
		if err != nil {
			rows.Close()
			return err
		}
		if seen != nil {
			if _, dup := seen[ev.ID]; dup {
				continue
			}
			seen[ev.ID] = struct{}{}
		}
		found = append(found, row{ev, channel})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, r := range found {
		if err := fn(r.ev, r.channel); err != nil {
			return err
		}
	}
	return nil
}

// Count returns how many stored events scope may see match any of filters (NIP-45).
func (s *Store) Count(ctx context.Context, community uuid.UUID, scope Scope, filters nostr.Filters) (int64, error) {
	sql, args, ok := BuildCount(community, scope, filters)
	if !ok {
		return 0, nil
	}
	var n int64
	err := s.pool.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

func scanEvent(rows pgx.Rows) (*nostr.Event, *uuid.UUID, error) {
	var (
		id, pubkey, sig []byte
		tags            []byte
		ev              nostr.Event
		kind            int32
		channel         *uuid.UUID
	)
	if err := rows.Scan(&id, &pubkey, &ev.CreatedAt, &kind, &tags, &ev.Content, &sig, &channel); err != nil {
		return nil, nil, err
	}
	if err := json.Unmarshal(tags, &ev.Tags); err != nil {
		return nil, nil, fmt.Errorf("stored tags of %x: %w", id, err)
	}
	ev.ID, ev.PubKey, ev.Sig, ev.Kind = hex.EncodeToString(id), hex.EncodeToString(pubkey), hex.EncodeToString(sig), int(kind)
	return &ev, channel, nil
}

// InsertParams maps a verified event to the EventInsert parameters.
// channelID is nil for a channel-less (community-global) event.
func InsertParams(community uuid.UUID, ev *nostr.Event, channelID *uuid.UUID) (db.EventInsertParams, error) {
	tags, err := json.Marshal(ev.Tags)
	if err != nil {
		return db.EventInsertParams{}, err
	}
	id, pubkey, sig := ev.IDBytes(), ev.PubKeyBytes(), ev.SigBytes()
	p := db.EventInsertParams{
		CommunityID: community,
		ID:          id[:],
		Pubkey:      pubkey[:],
		CreatedAt:   ev.CreatedAt,
		Kind:        int32(ev.Kind),
		Tags:        tags,
		Content:     ev.Content,
		Sig:         sig[:],
		ChannelID:   channelID,
	}
	if nostr.IsAddressable(ev.Kind) {
		d := ev.DTag()
		p.DTag = &d
	}
	return p, nil
}
