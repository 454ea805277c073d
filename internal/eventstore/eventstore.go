// Package eventstore reads and writes the events table for the relay's two
// spines. Fixed statements are sqlc queries (internal/db); the filter reads
// that sqlc cannot express statically are built here by one small builder
// with bound parameters only.
package eventstore

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/replica"
)

// Store serves filter reads from the pool it was given.
type Store struct {
	pool *pgxpool.Pool
	// MaxLimit caps every filter's limit (and is the default when none is given).
	MaxLimit int
	// PageRows is how many rows one database round trip of Query reads.
	PageRows int
	// StatementTimeout, when set, bounds each statement Query runs. Time a
	// slow client takes to receive one page is not charged to the next.
	StatementTimeout time.Duration
	// SearchCandidates is how many of the newest matches a NIP-50 search
	// ranks by relevance (at least the filter's limit).
	SearchCandidates int
	// ObserveQuery, when set, is told how long each hand-built statement took,
	// by its name (NameEventsQuery ...).
	ObserveQuery func(name string, seconds float64)
	// Router, when set, may serve Query and Count from a read replica that
	// proves it holds what they need (internal/replica); nil reads the
	// writer (pool) only.
	Router *replica.Router
}

// Route paths: the path label of buzz_db_route_decision for each read shape.
const (
	// PathChannelHistory: a read whose every filter is pinned to one channel
	// (#h) with an until: covered when the reader's wall reaches until,
	// else fresh.
	PathChannelHistory = "channel_history"
	// PathHistory: any other REQ or HTTP query: fresh only.
	PathHistory = "req_historical"
	// PathCount: COUNT is never covered (a count cannot show which rows
	// are missing): fresh only.
	PathCount = "count"
)

// DefaultPageRows is the PageRows of a new Store.
const DefaultPageRows = 200

// DefaultSearchCandidates is the SearchCandidates of a new Store.
const DefaultSearchCandidates = 1000

// New returns a Store reading from pool.
func New(pool *pgxpool.Pool, maxLimit int) *Store {
	return &Store{pool: pool, MaxLimit: maxLimit, PageRows: DefaultPageRows, SearchCandidates: DefaultSearchCandidates}
}

func (s *Store) observe(name string, start time.Time) {
	if s.ObserveQuery != nil {
		s.ObserveQuery(name, time.Since(start).Seconds())
	}
}

// Query streams the stored events that match filters and that scope may
// see, newest first, to fn with each event's channel (nil: community-global).
// An event matched by several filters is delivered once; each filter
// contributes at most its own limit. A single NIP-50 search filter comes
// most relevant first instead.
//
// Rows are read a page at a time (PageRows), each page on a pooled
// connection released before any of its rows goes to fn: fn may block on a
// slow client, and neither a connection nor more than a page of rows is held
// while it does. The next page continues after the last row sent (its
// created_at and id, and for a search its rank), so pages neither repeat nor
// skip rows.
func (s *Store) Query(ctx context.Context, community uuid.UUID, scope Scope, filters nostr.Filters, fn func(ev *nostr.Event, channel *uuid.UUID) error) error {
	var branches []pageBranch
	for i := range filters {
		f := &filters[i]
		limit := s.MaxLimit
		if f.Limit != nil && *f.Limit < limit {
			limit = *f.Limit
		}
		if canMatch(f) && limit > 0 {
			branches = append(branches, pageBranch{filter: i, limit: limit, remaining: limit})
		}
	}
	if len(filters) == 1 && filters[0].Search != "" {
		if len(branches) == 0 {
			return nil
		}
		return s.querySearch(ctx, community, scope, &filters[0], branches[0].limit, fn)
	}
	if len(branches) == 0 {
		return nil
	}
	// One routed session for the whole read: every page comes from one
	// reader snapshot, or, once the reader fails, from the writer.
	session := s.routeQuery(ctx, filters)
	defer func() {
		if session != nil {
			session.Abandon()
		}
	}()
	// A page must hold more rows than one event can occupy (one per branch),
	// or a page of one event's duplicates could not advance.
	pageRows := max(s.PageRows, len(branches)+1)
	var after *keyset
	for len(branches) > 0 {
		page, err := s.readPage(ctx, &session, community, scope, filters, branches, after, pageRows)
		if err != nil {
			return err
		}
		// A full page may end inside one event's run of duplicates, which
		// continues on the next page: leave that run to the next page.
		sent := len(page)
		if len(page) == pageRows {
			last := page[len(page)-1].id
			for sent > 0 && bytes.Equal(page[sent-1].id, last) {
				sent--
			}
			if sent == 0 {
				sent = len(page)
			}
		}
		remaining := map[int]int{}
		for _, br := range branches {
			remaining[br.filter] = br.remaining
		}
		for i, r := range page[:sent] {
			remaining[r.branch]--
			if i > 0 && bytes.Equal(page[i-1].id, r.id) {
				continue // the same event from another filter
			}
			if err := fn(r.ev, r.channel); err != nil {
				return err
			}
		}
		if len(page) < pageRows {
			break // every branch is exhausted
		}
		after = &keyset{createdUnix: page[sent-1].ev.CreatedAt, id: page[sent-1].id}
		kept := branches[:0]
		for _, br := range branches {
			if br.remaining = remaining[br.filter]; br.remaining > 0 {
				kept = append(kept, br)
			}
		}
		branches = kept
	}
	if session != nil {
		session.Served()
		session = nil
	}
	return nil
}

// routeQuery picks the reader session for a filter read, or nil for the
// writer. A NIP-50 search never routes: its ranking reads the full-text
// index, which a lagging reader would rank from stale rows, and it is not
// fenced like the other reads.
func (s *Store) routeQuery(ctx context.Context, filters nostr.Filters) *replica.Session {
	if s.Router == nil {
		return nil
	}
	var upper int64
	for i := range filters {
		f := &filters[i]
		if f.Search != "" {
			return nil
		}
		if !canMatch(f) {
			continue
		}
		// Covered needs every branch to return channel rows only (a pinned
		// channel bound in the statement) and to be bounded above.
		if _, pinned := pinnedChannel(f); !pinned || f.Until == nil {
			return s.Router.Begin(ctx, PathHistory, replica.Bounded())
		}
		upper = max(upper, clampUnix(*f.Until))
	}
	return s.Router.Begin(ctx, PathChannelHistory, replica.CoveredOrBounded(time.Unix(upper, 0)))
}

// onSession runs read on the session's reader transaction when there is
// one, else on the writer. A reader failure ends the session (recorded
// writer/replica_error) and the same read runs again on the writer, so a
// caller never gets a partial page from a reader that died under it.
func (s *Store) onSession(ctx context.Context, session **replica.Session, read func(q db.DBTX) error) error {
	if *session != nil {
		err := read((*session).Tx())
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err // the caller went away; the writer would not help
		}
		(*session).Failed(err)
		*session = nil
	}
	return read(s.pool)
}

type pageRow struct {
	ev      *nostr.Event
	channel *uuid.UUID
	id      []byte
	branch  int
	rank    float32
}

func (s *Store) statementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.StatementTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.StatementTimeout)
}

// readPage runs one page's statement and returns its rows, the connection
// already back in the pool.
func (s *Store) readPage(ctx context.Context, session **replica.Session, community uuid.UUID, scope Scope, filters nostr.Filters, branches []pageBranch, after *keyset, pageRows int) ([]pageRow, error) {
	sql, args := buildPage(community, scope, filters, branches, after, pageRows)
	capacity := pageCapacity(filters, branches, pageRows)
	var page []pageRow
	err := s.onSession(ctx, session, func(q db.DBTX) error {
		var err error
		page, err = s.readRows(ctx, q, NameEventsPage, sql, args, capacity, func(r *pageRow) []any {
			return []any{&r.branch}
		})
		return err
	})
	return page, err
}

// pageCapacity is how many rows a page can hold at most: pageRows, or fewer
// when the branches' remaining limits (and, for a filter by ids, its ids)
// add up to fewer. A REQ for one id or a small limit then allocates for
// what it can get, not for a whole page.
func pageCapacity(filters nostr.Filters, branches []pageBranch, pageRows int) int {
	n := 0
	for _, br := range branches {
		rows := br.remaining
		if ids := filters[br.filter].IDs; len(ids) > 0 {
			rows = min(rows, len(ids))
		}
		n += rows
	}
	return min(n, pageRows)
}

// querySearch streams one search filter's rows, most relevant first, a page
// at a time.
func (s *Store) querySearch(ctx context.Context, community uuid.UUID, scope Scope, f *nostr.Filter, limit int, fn func(ev *nostr.Event, channel *uuid.UUID) error) error {
	var after *keyset
	for remaining := limit; remaining > 0; {
		rows := min(remaining, max(s.PageRows, 1))
		sql, args := buildSearchPage(community, scope, f, after, rows, max(s.SearchCandidates, limit))
		page, err := s.readRows(ctx, s.pool, NameEventsSearch, sql, args, rows, func(r *pageRow) []any {
			return []any{&r.rank}
		})
		if err != nil {
			return err
		}
		for _, r := range page {
			if err := fn(r.ev, r.channel); err != nil {
				return err
			}
		}
		if len(page) < rows {
			return nil
		}
		remaining -= len(page)
		last := page[len(page)-1]
		after = &keyset{rank: last.rank, createdUnix: last.ev.CreatedAt, id: last.id}
	}
	return nil
}

// readRows runs one named statement under StatementTimeout and scans its
// rows (eventColumns, then the columns extra points at).
func (s *Store) readRows(ctx context.Context, q db.DBTX, name, sql string, args []any, capacity int, extra func(*pageRow) []any) ([]pageRow, error) {
	ctx, cancel := s.statementContext(ctx)
	defer cancel()
	defer s.observe(name, time.Now())
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	page := make([]pageRow, 0, capacity)
	for rows.Next() {
		var r pageRow
		r.ev, r.channel, r.id, err = scanEvent(rows, extra(&r)...)
		if err != nil {
			return nil, err
		}
		page = append(page, r)
	}
	return page, rows.Err()
}

// Count returns how many stored events scope may see match any of filters (NIP-45).
func (s *Store) Count(ctx context.Context, community uuid.UUID, scope Scope, filters nostr.Filters) (int64, error) {
	sql, args, ok := BuildCount(community, scope, filters)
	if !ok {
		return 0, nil
	}
	defer s.observe(NameEventsCount, time.Now())
	var session *replica.Session
	if s.Router != nil {
		session = s.Router.Begin(ctx, PathCount, replica.Bounded())
	}
	var n int64
	err := s.onSession(ctx, &session, func(q db.DBTX) error {
		return q.QueryRow(ctx, sql, args...).Scan(&n)
	})
	if session != nil {
		if err == nil {
			session.Served()
		} else {
			session.Abandon()
		}
	}
	return n, err
}

// scanEvent reads one row of eventColumns, then any extra columns into
// extra; it also returns the raw id, the keyset's tiebreaker.
func scanEvent(rows pgx.Rows, extra ...any) (*nostr.Event, *uuid.UUID, []byte, error) {
	var (
		id, pubkey, sig []byte
		tags            []byte
		ev              nostr.Event
		kind            int32
		channel         *uuid.UUID
	)
	dest := make([]any, 0, 8+len(extra)) // one allocation, where appending extra to a literal made two
	dest = append(dest, &id, &pubkey, &ev.CreatedAt, &kind, &tags, &ev.Content, &sig, &channel)
	dest = append(dest, extra...)
	if err := rows.Scan(dest...); err != nil {
		return nil, nil, nil, err
	}
	var err error
	if ev.Tags, err = nostr.ParseTags(tags); err != nil {
		// Every row the relay stored passed the same rules on the way in;
		// one written by other means may be laxer JSON.
		if jsonErr := json.Unmarshal(tags, &ev.Tags); jsonErr != nil {
			return nil, nil, nil, fmt.Errorf("stored tags of %x: %w", id, jsonErr)
		}
	}
	ev.ID, ev.PubKey, ev.Sig = hexStrings(id, pubkey, sig)
	ev.Kind = int(kind)
	return &ev, channel, id, nil
}

// hexStrings hex-encodes the id, pubkey and signature of a row into one
// string (one allocation where three EncodeToString calls make three) and
// returns its three parts.
func hexStrings(id, pubkey, sig []byte) (string, string, string) {
	var buf [2 * (32 + 32 + 64)]byte
	b := hex.AppendEncode(buf[:0], id)
	b = hex.AppendEncode(b, pubkey)
	b = hex.AppendEncode(b, sig)
	all := string(b)
	i, p := 2*len(id), 2*(len(id)+len(pubkey))
	return all[:i], all[i:p], all[p:]
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
