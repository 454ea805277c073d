// Package eventstore reads and writes the events table for the relay's two
// spines. Fixed statements are sqlc queries (internal/db); the filter reads
// that sqlc cannot express statically are built here by one small builder
// with bound parameters only.
package eventstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

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
	// PageBytes ends a page early once the events it holds reach this many
	// bytes (after the rows it needs to advance): a page is held while a
	// slow client takes its rows, and PageRows events of the largest size
	// a relay accepts would be tens of megabytes per connection.
	PageBytes int
	// StatementTimeout, when set, bounds each statement Query runs. Time a
	// slow client takes to receive one page is not charged to the next.
	StatementTimeout time.Duration
	// SearchCandidates is how many of the newest matches a NIP-50 search
	// ranks by relevance (at least the filter's limit).
	SearchCandidates int
	// ObserveQuery, when set, is told how long each hand-built statement took,
	// by its name (NameEventsQuery ...).
	ObserveQuery func(name string, seconds float64)
	// ReadSlots, when set, bounds how many of Query's and Count's
	// statements run on the writer pool at once: the rest of the pool stays
	// free for writes, which a storm of reads would otherwise keep waiting
	// for a connection. Reads beyond it, or beyond their client's share
	// (WithClient), wait for a slot, at most StatementTimeout (then
	// ErrReadSlotsBusy).
	ReadSlots *ReadSlots
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

// DefaultPageBytes is the PageBytes of a new Store: a page of 200 events of
// a usual size (a kilobyte or less) is well within it.
const DefaultPageBytes = 256 << 10

// DefaultSearchCandidates is the SearchCandidates of a new Store.
const DefaultSearchCandidates = 1000

// New returns a Store reading from pool.
func New(pool *pgxpool.Pool, maxLimit int) *Store {
	return &Store{pool: pool, MaxLimit: maxLimit, PageRows: DefaultPageRows, PageBytes: DefaultPageBytes, SearchCandidates: DefaultSearchCandidates}
}

func (s *Store) observe(name string, start time.Time) {
	if s.ObserveQuery != nil {
		s.ObserveQuery(name, time.Since(start).Seconds())
	}
}

// QueryJSON streams the stored events that match filters and that scope
// may see, newest first, to fn as their NIP-01 JSON objects (exactly the
// bytes nostr's AppendJSON makes), with each event's channel (nil:
// community-global). fn owns the bytes it is given.
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
func (s *Store) QueryJSON(ctx context.Context, community uuid.UUID, scope Scope, filters nostr.Filters, fn func(event []byte, channel *uuid.UUID) error) error {
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
	// One routed session for the whole read: every page comes from a
	// proved reader snapshot, or, once no proof holds, from the writer.
	session := s.routeQuery(ctx, community, scope, filters)
	defer func() {
		if session != nil {
			session.Abandon()
		}
	}()
	// A page must hold more rows than one event can occupy (one per branch),
	// or a page of one event's duplicates could not advance.
	pageRows := max(s.PageRows, len(branches)+1)
	rows := pageRows // asked of the next page
	var after *keyset
	for len(branches) > 0 {
		if after != nil {
			if err := s.readScopeAgain(ctx, &scope); err != nil {
				return err
			}
		}
		page, cut, err := s.readPage(ctx, &session, community, scope, filters, branches, after, rows)
		if err != nil {
			return err
		}
		if session != nil {
			// fn may wait on a slow client: hold no reader connection
			// meanwhile (the next page proves a snapshot of its own).
			session.Park()
		}
		full := cut || len(page) == rows
		rows = nextPageRows(rows, len(page), cut, len(branches)+1, pageRows)
		// A full page may end inside one event's run of duplicates, which
		// continues on the next page: leave that run to the next page.
		sent := len(page)
		if full {
			last := page[len(page)-1].id
			for sent > 0 && page[sent-1].id == last {
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
			if i > 0 && page[i-1].id == r.id {
				continue // the same event from another filter
			}
			if err := fn(r.event, r.channel); err != nil {
				return err
			}
		}
		if !full {
			break // every branch is exhausted
		}
		after = &keyset{createdUnix: page[sent-1].createdUnix, id: page[sent-1].id[:]}
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
// fenced like the other reads. Nor does agent_owner: it reads who owns
// which agent, rows no proof covers. A read with a live subscription after
// it (scope.Live) routes only when covered. Every read needs a proof
// written after the last removal of rows it may return (LastRemoval): a
// client that deleted a message does not read it back from a standby that
// has not replayed the deletion.
func (s *Store) routeQuery(ctx context.Context, community uuid.UUID, scope Scope, filters nostr.Filters) *replica.Session {
	if s.Router == nil {
		return nil
	}
	if readsUnprovenRows(filters) {
		return nil
	}
	var upper int64
	var removed time.Time
	for i := range filters {
		f := &filters[i]
		if !canMatch(f) {
			continue
		}
		// Covered needs every branch to return channel rows only (a pinned
		// channel bound in the statement) and to be bounded above.
		channel, pinned := pinnedChannel(f)
		if !pinned || f.Until == nil {
			if scope.Live {
				s.Router.Writer(PathHistory, replica.ReasonLive)
				return nil
			}
			return s.Router.Begin(ctx, PathHistory, replica.Bounded().After(s.Router.LastRemoval(community, nil)))
		}
		upper = max(upper, clampUnix(*f.Until))
		if at := s.Router.LastRemoval(community, &channel.id); at.After(removed) {
			removed = at
		}
		// A version stored in another channel replaces this channel's.
		if at := s.Router.LastReplacement(community); mayReturnVersions(f) && at.After(removed) {
			removed = at
		}
	}
	if scope.Live {
		return s.Router.Begin(ctx, PathChannelHistory, replica.Covered(time.Unix(upper, 0)).After(removed))
	}
	return s.Router.Begin(ctx, PathChannelHistory, replica.CoveredOrBounded(time.Unix(upper, 0)).After(removed))
}

// mayReturnVersions reports whether f may match replaceable or addressable
// kinds, whose slot spans channels.
func mayReturnVersions(f *nostr.Filter) bool {
	return f.Kinds == nil || slices.ContainsFunc(f.Kinds, func(k int) bool { return nostr.IsReplaceable(k) || nostr.IsAddressable(k) })
}

// readsUnprovenRows reports whether a read must stay on the writer
// whatever the proof: a NIP-50 search (the full-text index is not fenced
// like the other reads) or an agent_owner filter (it reads who owns which
// agent, rows no proof covers). A COUNT is such a read too.
func readsUnprovenRows(filters nostr.Filters) bool {
	for i := range filters {
		if filters[i].Search != "" || filters[i].AgentOwner != "" {
			return true
		}
	}
	return false
}

// onSession runs read on the session's reader transaction when there is
// one, else on the writer. A reader failure ends the session (recorded
// writer/replica_error) and the same read runs again on the writer, so a
// caller never gets a partial page from a reader that died under it. A
// parked session proves a new snapshot first; one that cannot (the reader
// fell behind, went away, or the proof went stale while a slow client
// drained the last page) ends before the statement, recorded
// writer/<reason>, and the writer reads it.
func (s *Store) onSession(ctx context.Context, session **replica.Session, read func(ctx context.Context, q db.DBTX) error) error {
	if *session != nil && !(*session).Holds(ctx) {
		*session = nil // no proof answers this page: the writer finishes
	}
	if *session != nil {
		statementCtx, cancel := (*session).StatementContext(ctx)
		err := read(statementCtx, (*session).Tx())
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err // the caller went away; the writer would not help
		}
		(*session).Failed(err)
		*session = nil
	}
	return s.onWriter(ctx, func(q db.DBTX) error { return read(ctx, q) })
}

// ErrReadSlotsBusy: every read slot stayed taken for StatementTimeout; the
// read did not run.
var ErrReadSlotsBusy = errors.New("eventstore: every read slot stayed busy")

// onWriter runs read on the writer pool, holding one of its read slots
// while it does. The wait for a slot is bounded like a statement.
func (s *Store) onWriter(ctx context.Context, read func(q db.DBTX) error) error {
	if s.ReadSlots != nil {
		wait, cancel := s.statementContext(ctx)
		release, err := s.ReadSlots.Acquire(wait)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return ErrReadSlotsBusy
		}
		defer release()
	}
	return read(s.pool)
}

// readScopeAgain has scope read the reader's channels again before a later
// page, bounded as a page's statement is: the ctx a read streams under
// bounds the whole stream or nothing (a slow client's download is its
// own), and a database read of the channels (after a membership change, or
// once the cached answer expired) that waited on a lock held a read slot,
// and the client's REQ, for as long.
func (s *Store) readScopeAgain(ctx context.Context, scope *Scope) error {
	ctx, cancel := s.statementContext(ctx)
	defer cancel()
	return scope.readAgain(ctx)
}

// pageRow is one stored event as a read sends it, and what paging needs.
type pageRow struct {
	event       []byte // the event's JSON object
	id          [32]byte
	createdUnix int64
	channel     *uuid.UUID
	branch      int     // buildPage's rows: the filter that matched
	rank        float32 // buildSearchPage's rows: the relevance
}

func (s *Store) statementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.StatementTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.StatementTimeout)
}

// readPage runs one page's statement and returns its rows, the connection
// already back in the pool. cut reports a page ended by PageBytes.
func (s *Store) readPage(ctx context.Context, session **replica.Session, community uuid.UUID, scope Scope, filters nostr.Filters, branches []pageBranch, after *keyset, pageRows int) (page []pageRow, cut bool, err error) {
	sql, args := buildPage(community, scope, filters, branches, after, pageRows, s.SearchCandidates)
	capacity := pageCapacity(filters, branches, pageRows)
	err = s.onSession(ctx, session, func(ctx context.Context, q db.DBTX) error {
		var err error
		// One row per branch plus one: a page cut short must still hold
		// more than one event's duplicates, or it could not advance.
		page, cut, err = s.readRows(ctx, q, NameEventsPage, sql, args, capacity, len(branches)+1, extraBranch)
		return err
	})
	return page, cut, err
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
func (s *Store) querySearch(ctx context.Context, community uuid.UUID, scope Scope, f *nostr.Filter, limit int, fn func(event []byte, channel *uuid.UUID) error) error {
	var after *keyset
	pageRows := max(s.PageRows, 1)
	for remaining := limit; remaining > 0; {
		if after != nil {
			if err := s.readScopeAgain(ctx, &scope); err != nil {
				return err
			}
		}
		rows := min(remaining, pageRows)
		sql, args := buildSearchPage(community, scope, f, after, rows, max(s.SearchCandidates, limit))
		var page []pageRow
		var cut bool
		err := s.onWriter(ctx, func(q db.DBTX) error {
			var err error
			page, cut, err = s.readRows(ctx, q, NameEventsSearch, sql, args, rows, 1, extraRank)
			return err
		})
		if err != nil {
			return err
		}
		for _, r := range page {
			if err := fn(r.event, r.channel); err != nil {
				return err
			}
		}
		if !cut && len(page) < rows {
			return nil
		}
		pageRows = nextPageRows(rows, len(page), cut, 1, max(s.PageRows, 1))
		remaining -= len(page)
		last := page[len(page)-1]
		after = &keyset{rank: last.rank, createdUnix: last.createdUnix, id: last.id[:]}
	}
	return nil
}

// nextPageRows is how many rows to ask of the next page, after a page
// asked for asked rows returned got, cut by PageBytes or not. A page cut
// short still read all its rows off the connection: asking as many again
// would read and drop the same large events page after page, so the next
// asks for what fitted (at least least); a page that came back whole
// doubles that again, up to most.
func nextPageRows(asked, got int, cut bool, least, most int) int {
	if cut {
		return max(least, got)
	}
	return min(most, max(least, asked*2))
}

// readRows runs one named statement under StatementTimeout and decodes
// its rows (eventColumns, then the one extra column). Once it holds
// minRows rows and their events reach PageBytes it stops (cut): the rest
// of the statement's rows are read off the connection and dropped, and
// the next page starts after the last row kept.
func (s *Store) readRows(ctx context.Context, q db.DBTX, name, sql string, args []any, capacity, minRows int, extra extraColumn) (page []pageRow, cut bool, err error) {
	ctx, cancel := s.statementContext(ctx)
	defer cancel()
	defer s.observe(name, time.Now())
	rows, err := q.Query(ctx, sql, append([]any{rowFormats}, args...)...)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	page = make([]pageRow, 0, capacity)
	bytes := 0
	for rows.Next() {
		if s.PageBytes > 0 && bytes >= s.PageBytes && len(page) >= minRows {
			cut = true
			break
		}
		var r pageRow
		if err := decodeRow(&r, rows.RawValues(), extra); err != nil {
			return nil, false, err
		}
		page = append(page, r)
		bytes += len(r.event)
	}
	rows.Close()
	return page, cut, rows.Err()
}

// rowFormats asks for every column of a read in the format decodeRow
// reads straight into JSON: bytea, integers, uuid and real in binary, the
// jsonb tags as JSON text and the content as its text.
var rowFormats = pgx.QueryResultFormats{
	pgx.BinaryFormatCode, // id
	pgx.BinaryFormatCode, // pubkey
	pgx.BinaryFormatCode, // created_unix (bigint)
	pgx.BinaryFormatCode, // kind (integer)
	pgx.TextFormatCode,   // tags (jsonb)
	pgx.TextFormatCode,   // content
	pgx.BinaryFormatCode, // sig
	pgx.BinaryFormatCode, // channel_id (uuid)
	pgx.BinaryFormatCode, // the extra column: branch (integer) or rank (real)
}

// extraColumn is the column a statement selects after eventColumns.
type extraColumn int

const (
	extraBranch extraColumn = iota // integer
	extraRank                      // real
)

// decodeRow fills r from one row's raw values in rowFormats: the event's
// JSON is built from the row's own bytes, the only allocation a row needs
// (two for a channel event).
func decodeRow(r *pageRow, raw [][]byte, extra extraColumn) error {
	if len(raw) != 9 {
		return fmt.Errorf("stored event row: %d columns, want 9", len(raw))
	}
	id, pubkey, created, kind, tags, content, sig, channel, x := raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7], raw[8]
	if len(id) != 32 || len(pubkey) != 32 || len(sig) != 64 || len(created) != 8 || len(kind) != 4 || len(x) != 4 || tags == nil || content == nil ||
		(channel != nil && len(channel) != 16) {
		return fmt.Errorf("stored event row %x: unexpected column sizes", id)
	}
	r.id = [32]byte(id)
	r.createdUnix = int64(binary.BigEndian.Uint64(created))
	if channel != nil {
		ch := uuid.UUID(channel)
		r.channel = &ch
	}
	switch extra {
	case extraBranch:
		r.branch = int(int32(binary.BigEndian.Uint32(x)))
	case extraRank:
		r.rank = math.Float32frombits(binary.BigEndian.Uint32(x))
	}
	// Room for the hex fields, the keys and a few escapes.
	r.event = make([]byte, 0, 400+len(tags)+len(content)+len(content)/16)
	r.event = nostr.AppendStoredJSON(r.event, id, pubkey, r.createdUnix, int(int32(binary.BigEndian.Uint32(kind))), tags, content, sig)
	return nil
}

// Count returns how many stored events scope may see match any of filters
// (NIP-45), at most MaxCount; approximate says there are more.
func (s *Store) Count(ctx context.Context, community uuid.UUID, scope Scope, filters nostr.Filters) (n int64, approximate bool, err error) {
	sql, args, ok := BuildCount(community, scope, filters)
	if !ok {
		return 0, false, nil
	}
	defer s.observe(NameEventsCount, time.Now())
	var session *replica.Session
	if s.Router != nil && !readsUnprovenRows(filters) {
		session = s.Router.Begin(ctx, PathCount, replica.Bounded().After(s.Router.LastRemoval(community, nil)))
	}
	err = s.onSession(ctx, &session, func(ctx context.Context, q db.DBTX) error {
		return countIn(ctx, q.(batcher), sql, args, &n)
	})
	if session != nil {
		if err == nil {
			session.Served()
		} else {
			session.Abandon()
		}
	}
	if n > MaxCount {
		return MaxCount, true, err
	}
	return n, false, err
}

// batcher is what a read runs on, a pool or a transaction.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// seqscanOff turns sequential scans off until the end of the transaction
// it runs in.
const seqscanOff = "-- name: EventsCountSeqscanOff\nSELECT set_config('enable_seqscan', 'off', true)"

// countIn runs a COUNT statement and scans its one value into into, with
// sequential scans off. Under its limit a count may stop anywhere, and the
// planner, taking a community's rows to be spread evenly through the
// table, costs a scan of the whole table that stops at the limit below the
// community's own index: it then reads every other community's rows stored
// before the counted one's. Without it, the count reads the community's
// index entries and at most the limit's rows.
//
// The setting and the count go in one batch, one round trip: a batch runs
// in a transaction of its own (on a replica session's transaction, within
// it), which the setting ends with, so it never reaches another statement
// of the pooled connection.
func countIn(ctx context.Context, q batcher, sql string, args []any, into any) error {
	b := &pgx.Batch{}
	b.Queue(seqscanOff)
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(into) })
	return q.SendBatch(ctx, b).Close()
}

// tagsJSON is the text of an event's tags column, which PostgreSQL reads as
// jsonb. The nostr package's encoder writes it without encoding/json's
// reflection; jsonb stores the same strings whichever of the two escaped
// them (encoding/json also escapes <, >, & and U+2028). What the two would
// store differently goes through encoding/json, as before: a nil list or
// tag (null to encoding/json) and invalid UTF-8 (replaced by U+FFFD), neither
// of which a parsed event holds.
func tagsJSON(tags nostr.Tags) ([]byte, error) {
	if tags == nil {
		return json.Marshal(tags)
	}
	size := 2
	for _, tag := range tags {
		if tag == nil {
			return json.Marshal(tags)
		}
		size += 3
		for _, v := range tag {
			if !utf8.ValidString(v) {
				return json.Marshal(tags)
			}
			size += len(v) + 3
		}
	}
	return nostr.AppendTagsJSON(make([]byte, 0, size), tags), nil
}

// InsertParams maps a verified event to the EventInsert parameters.
// channelID is nil for a channel-less (community-global) event.
func InsertParams(community uuid.UUID, ev *nostr.Event, channelID *uuid.UUID) (db.EventInsertParams, error) {
	tags, err := tagsJSON(ev.Tags)
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
	// Ingest refused a malformed expiration; a row written without ingest
	// (an import) keeps the event without one rather than failing. A
	// deletion request never expires (NIP-09 keeps it indefinitely): purged,
	// it would let the versions of an address it deleted be sent again.
	if at, ok, _ := ev.Expiration(); ok && ev.Kind != nostr.KindDeletion {
		at = clampUnix(at)
		p.ExpiresAt = &at
	}
	return p, nil
}
