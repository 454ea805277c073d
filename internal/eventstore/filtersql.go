package eventstore

import (
	"context"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// The columns every event read selects, in decodeRow's order (rowFormats).
const eventColumns = "id, pubkey, extract(epoch FROM created_at)::bigint AS created_unix, kind, tags, content, sig, channel_id"

// sqlBuilder accumulates one statement's text and its bound arguments. Filter
// values are never spliced into the SQL: every one is a parameter.
type sqlBuilder struct {
	sql  strings.Builder
	args []any
}

func (b *sqlBuilder) arg(v any) string {
	b.args = append(b.args, v)
	return "$" + strconv.Itoa(len(b.args))
}

// canMatch reports whether a filter could match any stored event: a present
// but empty list or an empty time window matches nothing, and such filters
// are left out of the statement. Limits are the caller's business.
func canMatch(f *nostr.Filter) bool {
	if (f.IDs != nil && len(f.IDs) == 0) || (f.Authors != nil && len(f.Authors) == 0) || (f.Kinds != nil && len(f.Kinds) == 0) {
		return false
	}
	for _, vals := range f.Tags {
		if len(vals) == 0 {
			return false
		}
	}
	if f.Since != nil && f.Until != nil && *f.Since > *f.Until {
		return false
	}
	return true
}

// conditions appends " AND ..." for every constraint of f. communityArg is
// the statement's community parameter, which the owner constraint reuses.
func (b *sqlBuilder) conditions(f *nostr.Filter, communityArg string) {
	if ch, ok := pinnedChannel(f); ok {
		// The same rows the #h test selects (every h tag names its event's
		// channel), bound as the column: the statement can then return
		// channel rows only, which lets a replica prove it holds them all.
		b.sql.WriteString(" AND channel_id = " + b.arg(ch.id) + "::uuid")
	}
	if f.IDs != nil {
		inList(b, "id", "bytea", hexBytes(f.IDs))
	}
	if f.Authors != nil {
		inList(b, "pubkey", "bytea", hexBytes(f.Authors))
	}
	if f.Kinds != nil {
		kinds := make([]int32, len(f.Kinds))
		for i, k := range f.Kinds {
			kinds[i] = int32(k)
		}
		inList(b, "kind", "int", kinds)
	}
	// AND across tag names, OR within one: one overlap test per name against
	// the GIN-indexed 'name:value' array.
	// Sorted names keep the SQL text deterministic.
	for _, name := range slices.Sorted(maps.Keys(f.Tags)) {
		vals := f.Tags[name]
		keys := make([]string, len(vals))
		for i, v := range vals {
			keys[i] = name + ":" + v
		}
		if channels := channelIDs(f, name); len(channels) > 0 {
			// A deletion without an h tag is stored in its targets'
			// channel and read as if it carried that channel's h tag.
			b.sql.WriteString(" AND (tag_index && " + b.arg(keys) + "::text[] OR (kind = " + strconv.Itoa(nostr.KindDeletion) +
				" AND channel_id = ANY(" + b.arg(channels) + "::uuid[])))")
			continue
		}
		b.sql.WriteString(" AND tag_index && " + b.arg(keys) + "::text[]")
	}
	if f.Since != nil {
		b.sql.WriteString(" AND created_at >= to_timestamp(" + b.arg(clampUnix(*f.Since)) + "::bigint)")
	}
	if f.Until != nil {
		b.sql.WriteString(" AND created_at <= to_timestamp(" + b.arg(clampUnix(*f.Until)) + "::bigint)")
	}
	if f.Search != "" {
		b.sql.WriteString(" AND search_tsv @@ " + b.tsquery(f.Search))
	}
	if f.AgentOwner != "" {
		// In the WHERE clause, so the owner narrows the rows before the
		// limit counts them: the owned match is never crowded out by other
		// owners' same-name agents. Owners are this community's own, and
		// an owner whose attestation ended owns nothing.
		owner, _ := hex.DecodeString(f.AgentOwner)
		b.sql.WriteString(" AND pubkey IN (SELECT u.pubkey FROM users u WHERE u.community_id = " + communityArg + " AND u.agent_owner_pubkey = " + b.arg(owner) + "::bytea" +
			" AND (u.agent_owner_until IS NULL OR u.agent_owner_until > now()))")
	}
}

// channelProof is the evidence that a statement returns channel rows
// only: a channel id bound unconditionally as channel_id. Only
// pinnedChannel makes one; a list of readable channels is no such proof
// (the scope keeps channel-less rows).
type channelProof struct{ id uuid.UUID }

// pinnedChannel is the one channel a filter's #h names, when it names
// exactly one.
func pinnedChannel(f *nostr.Filter) (channelProof, bool) {
	h := f.Tags["h"]
	if len(h) != 1 {
		return channelProof{}, false
	}
	id, err := uuid.Parse(h[0])
	if err != nil {
		return channelProof{}, false
	}
	return channelProof{id: id}, true
}

// channelIDs is the channels a filter's #h names, when name is h and the
// filter may return deletions: the values that are channel ids (UUIDs). A
// filter whose kinds leave out deletions (a channel's timeline of kind 9)
// keeps the plain tag test.
func channelIDs(f *nostr.Filter, name string) []uuid.UUID {
	if name != "h" || f.Kinds != nil && !slices.Contains(f.Kinds, nostr.KindDeletion) {
		return nil
	}
	var ids []uuid.UUID
	for _, v := range f.Tags["h"] {
		if id, err := uuid.Parse(v); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// tsquery returns the expression of a NIP-50 search's query. The words go
// to websearch_to_tsquery, which accepts any user text without syntax
// errors; the links (nostr.ParseSearch) are a tsquery built in Go, and only
// a search with links carries one.
func (b *sqlBuilder) tsquery(search string) string {
	q := nostr.ParseSearch(search)
	if q.Links == "" {
		return "websearch_to_tsquery('simple', " + b.arg(q.Text) + "::text)"
	}
	links := b.arg(q.Links) + "::text::tsquery"
	if strings.TrimSpace(q.Text) == "" {
		return links
	}
	return "(websearch_to_tsquery('simple', " + b.arg(q.Text) + "::text) && " + links + ")"
}

// maxUnix is 9999-12-31T23:59:59Z. Clients may send any int64 for since and
// until, but to_timestamp fails far beyond it; no stored event is later.
const maxUnix = 253402300799

func clampUnix(v int64) int64 { return min(v, maxUnix) }

// order is a branch's ORDER BY: relevance for a NIP-50 search, else newest first.
func (b *sqlBuilder) order(f *nostr.Filter) {
	if f.Search != "" {
		b.sql.WriteString(" ORDER BY ts_rank(search_tsv, " + b.tsquery(f.Search) + ") DESC, created_at DESC, id DESC")
		return
	}
	b.sql.WriteString(" ORDER BY created_at DESC, id DESC")
}

// Scope is what one reader may see (docs/read-scope.md). Every read is scoped: rows of
// channels outside Channels never come back, and p-gated kinds (direct
// messages, gift wraps, membership notifications) only when Reader is a
// party: p-tagged or their author.
type Scope struct {
	Channels []uuid.UUID // readable channels
	Reader   string      // the reader's hex pubkey
	// Readable, when set, is asked before every page after the first: the
	// channels the reader may read now. A read streamed in pages outlives
	// the answer it began with (a slow client, a long history), and a
	// member removed meanwhile was sent what the channel stored after the
	// removal, when dated before the page's position (a client's clock
	// behind the relay's, a message in flight).
	// changed is false when they are the Channels already held.
	Readable func(ctx context.Context) (channels []uuid.UUID, changed bool, err error)
	// Live: a live subscription, registered before this read, carries on
	// after it. Only a covered proof may send such a read to a standby: an
	// event fanned out before the subscription and not yet replayed by a
	// fresh-enough standby would never reach the client at all.
	Live bool
	// Now is the relay's clock when the read arrived: an event expired by
	// it is not served, whichever server answers. A standby's clock is not
	// the writer's, and judged by the answering server's own now() an
	// expired event came back from a standby whose clock lags. Zero: the
	// answering server's now().
	Now time.Time
}

// readAgain replaces the readable channels by what Readable answers now.
func (s *Scope) readAgain(ctx context.Context) error {
	if s.Readable == nil {
		return nil
	}
	channels, changed, err := s.Readable(ctx)
	if changed {
		s.Channels = channels
	}
	return err
}

// scopeConditions appends the reader's visibility predicates. Kept apart
// from the filter's own conditions so every statement shape carries them.
// f is the one filter the statement reads, nil when it reads several.
func (b *sqlBuilder) scopeConditions(s Scope, channels string, f *nostr.Filter) {
	b.sql.WriteString(" AND (channel_id IS NULL OR channel_id = ANY(" + channels + "::uuid[]))")
	// NIP-40: an expired event is never served, whether or not its row has
	// been purged yet.
	if s.Now.IsZero() {
		b.sql.WriteString(" AND (expires_at IS NULL OR expires_at > now())")
	} else {
		b.sql.WriteString(" AND (expires_at IS NULL OR expires_at > " + b.arg(s.Now) + "::timestamptz)")
	}
	if f != nil && excludesPGated(f) {
		// Every row the filter can return passes the p-gate: leaving it out
		// spares the planner and every row a test that cannot fail.
		return
	}
	reader, _ := hex.DecodeString(s.Reader) // authenticated: always 64 hex digits
	b.sql.WriteString(" AND (kind <> ALL(" + b.arg(nostr.PGatedKinds()) + "::int[]) OR tag_index && ARRAY[" + b.arg("p:"+s.Reader) +
		"::text] OR pubkey = " + b.arg(reader) + "::bytea)")
}

// excludesPGated reports whether f names its kinds and none is p-gated.
func excludesPGated(f *nostr.Filter) bool {
	if f.Kinds == nil {
		return false
	}
	for _, k := range f.Kinds {
		if nostr.IsPGated(k) {
			return false
		}
	}
	return true
}

// inList appends a membership test. A single value becomes plain equality:
// a prepared statement's generic plan cannot walk an index in order for
// "= ANY($n)", so "kinds":[1] with a limit would sort every kind-1 row
// instead of reading the newest 100 off the index.
func inList[T any](b *sqlBuilder, column, sqlType string, values []T) {
	if len(values) == 1 {
		b.sql.WriteString(" AND " + column + " = " + b.arg(values[0]) + "::" + sqlType)
		return
	}
	b.sql.WriteString(" AND " + column + " = ANY(" + b.arg(values) + "::" + sqlType + "[])")
}

// Statement names: every hand-built statement starts with one, like the
// generated queries' "-- name:" lines, so logs, pg_stat_statements and the
// per-query timings name it.
const (
	NameEventsQuery  = "EventsQuery"
	NameEventsPage   = "EventsQueryPage"
	NameEventsSearch = "EventsSearchPage"
	NameEventsCount  = "EventsCount"
)

func named(name, sql string) string { return "-- name: " + name + "\n" + sql }

// pageBranch is one filter's part of a paged read: how many more of its
// rows may still be sent (its limit minus the rows already sent).
type pageBranch struct {
	filter    int
	limit     int // the filter's own limit
	remaining int
}

// keyset is the position after the last row sent: newest first, or for a
// single search filter, most relevant first (rank).
type keyset struct {
	rank        float32
	createdUnix int64
	id          []byte
}

// buildPage returns the statement for the next page of a time-ordered read:
// each branch is its filter's newest rows older than after (all rows when
// after is nil), at most its remaining count, tagged with its index; the
// union is merged newest first and cut at pageRows. Rows matched by several
// filters come back once per branch, next to each other.
func buildPage(community uuid.UUID, scope Scope, filters nostr.Filters, branches []pageBranch, after *keyset, pageRows, searchCandidates int) (string, []any) {
	var b sqlBuilder
	communityArg := b.arg(community)
	channelsArg := b.arg(scope.Channels)
	// One branch is already its page, newest first: merging it would only
	// cost a plan node and a sort of rows already in order.
	merged := len(branches) > 1
	if merged {
		b.sql.WriteString("SELECT * FROM (\n")
	}
	for i, br := range branches {
		if i > 0 {
			b.sql.WriteString("\nUNION ALL\n")
		}
		f := &filters[br.filter]
		if f.Search != "" {
			// A search filter's rows are its limit most relevant among its
			// newest candidates, as for a lone search; that set is then
			// merged by time like any other branch.
			b.sql.WriteString("(SELECT " + eventColumns + ", " + strconv.Itoa(br.filter) + " AS branch FROM (SELECT * FROM ")
			b.rankedCandidates(scope, communityArg, channelsArg, f, max(searchCandidates, br.limit))
			b.sql.WriteString(" ranked ORDER BY rank DESC, created_at DESC, id DESC LIMIT " + b.arg(int32(br.limit)) + ") top")
			if after != nil {
				b.sql.WriteString(" WHERE (created_at, id) < (to_timestamp(" + b.arg(after.createdUnix) + "::bigint), " + b.arg(after.id) + "::bytea)")
			}
			b.sql.WriteString(" ORDER BY created_at DESC, id DESC LIMIT " + b.arg(int32(min(br.remaining, pageRows))) + ")")
			continue
		}
		b.sql.WriteString("(SELECT " + eventColumns + ", " + strconv.Itoa(br.filter) + " AS branch FROM events WHERE community_id = " + communityArg + " AND deleted_at IS NULL")
		b.scopeConditions(scope, channelsArg, f)
		b.conditions(f, communityArg)
		if after != nil {
			b.sql.WriteString(" AND (created_at, id) < (to_timestamp(" + b.arg(after.createdUnix) + "::bigint), " + b.arg(after.id) + "::bytea)")
		}
		b.sql.WriteString(" ORDER BY created_at DESC, id DESC LIMIT " + b.arg(int32(min(br.remaining, pageRows))) + ")")
	}
	if merged {
		b.sql.WriteString("\n) matched ORDER BY created_unix DESC, id DESC LIMIT " + b.arg(int32(pageRows)))
	}
	return named(NameEventsPage, b.sql.String()), b.args
}

// buildSearchPage returns the next page of a read with one search filter:
// the newest candidates matches, ranked by relevance, rows of them after
// the keyset. Ranking every match would make a common word cost the whole
// table (a ts_rank per matching row, hundreds of thousands at a million
// events); ranking the newest matches keeps the cost bounded whatever the
// word, and in chat the newest matches are the ones a reader wants. The
// rank is selected after eventColumns.
func buildSearchPage(community uuid.UUID, scope Scope, f *nostr.Filter, after *keyset, rows, candidates int) (string, []any) {
	var b sqlBuilder
	communityArg := b.arg(community)
	channelsArg := b.arg(scope.Channels)
	b.sql.WriteString("SELECT " + eventColumns + ", rank FROM ")
	b.rankedCandidates(scope, communityArg, channelsArg, f, candidates)
	b.sql.WriteString(" ranked")
	if after != nil {
		b.sql.WriteString(" WHERE (rank, created_at, id) < (" + b.arg(after.rank) + "::real, to_timestamp(" + b.arg(after.createdUnix) + "::bigint), " + b.arg(after.id) + "::bytea)")
	}
	b.sql.WriteString(" ORDER BY rank DESC, created_at DESC, id DESC LIMIT " + b.arg(int32(rows)))
	return named(NameEventsSearch, b.sql.String()), b.args
}

// rankedCandidates appends a parenthesized subquery: search filter f's
// newest candidates matches that scope may see, each with its rank.
func (b *sqlBuilder) rankedCandidates(scope Scope, communityArg, channelsArg string, f *nostr.Filter, candidates int) {
	query := b.tsquery(f.Search)
	b.sql.WriteString("(SELECT *, ts_rank(search_tsv, " + query + ") AS rank FROM (" +
		"SELECT id, pubkey, created_at, kind, tags, content, sig, channel_id, search_tsv FROM events WHERE community_id = " + communityArg + " AND deleted_at IS NULL")
	b.scopeConditions(scope, channelsArg, f)
	b.conditions(f, communityArg)
	b.sql.WriteString(" ORDER BY created_at DESC, id DESC LIMIT " + b.arg(int32(candidates)) + ") recent)")
}

// BuildSelect returns the statement that reads the stored events matching
// any of filters in one community: each filter newest first (a search
// filter by relevance) and capped at its own limit (at most maxLimit),
// deleted events hidden before the limit applies. Several filters are merged
// newest first. ok is false when no filter can match anything.
func BuildSelect(community uuid.UUID, scope Scope, filters nostr.Filters, maxLimit int) (sql string, args []any, ok bool) {
	var b sqlBuilder
	communityArg := b.arg(community)
	channelsArg := b.arg(scope.Channels)
	n := 0
	for i := range filters {
		f := &filters[i]
		if !canMatch(f) || (f.Limit != nil && *f.Limit == 0) {
			continue
		}
		if n > 0 {
			b.sql.WriteString("\nUNION ALL\n")
		}
		n++
		limit := maxLimit
		if f.Limit != nil && *f.Limit < maxLimit {
			limit = *f.Limit
		}
		b.sql.WriteString("(SELECT " + eventColumns + " FROM events WHERE community_id = " + communityArg + " AND deleted_at IS NULL")
		b.scopeConditions(scope, channelsArg, f)
		b.conditions(f, communityArg)
		b.order(f)
		b.sql.WriteString(" LIMIT " + b.arg(int32(limit)) + ")")
	}
	if n == 0 {
		return "", nil, false
	}
	if n == 1 {
		return named(NameEventsQuery, b.sql.String()), b.args, true
	}
	return named(NameEventsQuery, "SELECT * FROM (\n"+b.sql.String()+"\n) matched ORDER BY created_unix DESC, id DESC"), b.args, true
}

// MaxCount is the most matches a COUNT counts; past it the answer is
// MaxCount, flagged approximate (NIP-45), meaning "at least". Counted to the
// end, a COUNT reads every match: one of a whole community of 300,000
// events read 43,000 buffers in 1.4 s, and any reader may send it again and
// again from every connection, each holding a read slot until its
// statement timeout once the community is a few million events large.
const MaxCount = 10_000

// BuildCount returns the statement counting stored events that match any of
// filters in one community (NIP-45; limits do not apply), up to MaxCount+1
// of them, so a count past MaxCount stops reading there.
func BuildCount(community uuid.UUID, scope Scope, filters nostr.Filters) (sql string, args []any, ok bool) {
	var b sqlBuilder
	communityArg := b.arg(community)
	b.sql.WriteString("SELECT count(*) FROM (SELECT FROM events WHERE community_id = " + communityArg + " AND deleted_at IS NULL")
	b.scopeConditions(scope, b.arg(scope.Channels), nil)
	b.sql.WriteString(" AND (")
	n := 0
	for i := range filters {
		f := &filters[i]
		if !canMatch(f) {
			continue
		}
		if n > 0 {
			b.sql.WriteString(" OR ")
		}
		n++
		b.sql.WriteString("(TRUE")
		b.conditions(f, communityArg)
		b.sql.WriteString(")")
	}
	b.sql.WriteString(") LIMIT " + strconv.Itoa(MaxCount+1) + ") counted")
	if n == 0 {
		return "", nil, false
	}
	return named(NameEventsCount, b.sql.String()), b.args, true
}

func hexBytes(values []string) [][]byte {
	out := make([][]byte, 0, len(values))
	for _, v := range values {
		if b, err := hex.DecodeString(v); err == nil {
			out = append(out, b)
		}
	}
	return out
}
