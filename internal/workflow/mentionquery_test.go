package workflow_test

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
	"github.com/buzzrelay/buzz/internal/workflow/mention"
)

// The database folds a display name exactly as the mention rules fold it
// in Go, for every character: the step looks members up by the folded
// name, so a character the two fold differently would make a member
// unmentionable. lower() would not do: it follows the collation.
// Mutation killed: the table missing a pair ("İ" -> "i") differs from Go
// at that character.
func TestMentionFoldIsGoFold(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// Beyond plane 1 no character changes case (CJK, tags, private use):
	// checked here in Go, so the database is asked only about planes 0
	// and 1, where each non-ASCII character costs a search of the table.
	const checked = 0x20000
	for r := rune(checked); r <= unicode.MaxRune; r++ {
		require.Equal(t, r, unicode.ToLower(r), "U+%04X changes case: check it in the database too", r)
	}
	var all []rune
	for r := rune(1); r < checked; r++ {
		if r < 0xD800 || r > 0xDFFF {
			all = append(all, r)
		}
	}
	// The ASCII characters alone take the function's ASCII path; then in
	// slices, so that a difference names its character.
	parts := [][]rune{all[:0x7F]}
	for start := 0; start < len(all); start += 0x4000 {
		parts = append(parts, all[start:min(start+0x4000, len(all))])
	}
	for _, part := range parts {
		var got string
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT mention_fold($1)`, string(part)).Scan(&got))
		want := []rune(mention.Fold(string(part)))
		require.Len(t, []rune(got), len(want))
		for i, r := range []rune(got) {
			require.Equal(t, want[i], r, "U+%04X folds to U+%04X in Go, U+%04X in the database", part[i], want[i], r)
		}
	}
}

// addMembers puts n members named "<prefix> <i>" into channel, directly:
// a channel of 100,000 members through events would take minutes.
func (f *fixture) addMembers(channel string, prefix string, n int) {
	f.t.Helper()
	_, err := f.pool.Exec(f.ctx, `
		WITH u AS (
			INSERT INTO users (community_id, pubkey, display_name)
			SELECT $1, sha256(($3 || i)::bytea), $3 || ' ' || i FROM generate_series(1, $4::int) i
			RETURNING community_id, pubkey)
		INSERT INTO channel_members (community_id, channel_id, pubkey) SELECT community_id, $2, pubkey FROM u`,
		f.tenant.ID(), channel, prefix, n)
	require.NoError(f.t, err)
	_, err = f.pool.Exec(f.ctx, `ANALYZE users; ANALYZE channel_members`)
	require.NoError(f.t, err)
}

// A send_message step reads only the members whose folded name is one of
// its template's candidates, not its channel's member list: in a channel
// of 5,000 named members, a template naming three of them reads a
// handful of rows of users and channel_members, where it read 5,000 of
// each (TestStepWakesWhomItsTemplateNames checks it still wakes them).
// Mutation killed: mentionable reading every member
// (ChannelMemberDisplayNames) reads 5,000 rows of each table.
func TestStepReadsOnlyTheMembersItsTemplateCouldName(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, robby, zoe := f.key(), f.key(), f.key()
	ch := f.channel(owner, robby, zoe)
	f.profile(robby, "Robby")
	f.profile(zoe, "ZOË Ann")
	const others = 5_000
	f.addMembers(ch, "member", others)
	template := "@Robby, (@zoë ann) and @member 17 please look at {{trigger.text}}"

	tx, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(f.ctx) }()
	usersBefore, membersBefore := dbtest.RowsRead(t, tx, "users"), dbtest.RowsRead(t, tx, "channel_members")
	members, err := workflow.Mentionable(f.ctx, db.New(tx), f.tenant.ID(), uuid.MustParse(ch), template)
	require.NoError(t, err)
	var names []string
	for _, m := range members {
		names = append(names, m.DisplayName)
	}
	require.ElementsMatch(t, []string{"Robby", "ZOË Ann", "member 17"}, names)
	users, channelMembers := dbtest.RowsRead(t, tx, "users")-usersBefore, dbtest.RowsRead(t, tx, "channel_members")-membersBefore
	candidates, ok := mention.Candidates(template)
	require.True(t, ok)
	t.Logf("rows read for %d candidates in a channel of %d members: users %d, channel_members %d", len(candidates), others+3, users, channelMembers)
	require.LessOrEqual(t, users, int64(len(candidates)), "users rows read")
	require.LessOrEqual(t, channelMembers, int64(len(candidates)), "channel_members rows read")
}

// The step wakes whom its template names, looked up by folded name: names
// in any case and script, the longest name at an "@", nobody for a name
// two members share, never a non-member of the same name, never the owner.
// Mutation killed: a fold table without "İ" -> "i" misses "İbo".
func TestStepWakesWhomItsTemplateNames(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, robby, zoe, ibo, twin1, twin2, sam, samSmith, outsider := f.key(), f.key(), f.key(), f.key(), f.key(), f.key(), f.key(), f.key(), f.key()
	ch := f.channel(owner, robby, zoe, ibo, twin1, twin2, sam, samSmith)
	f.channel(outsider)
	for k, name := range map[*nostr.SecretKey]string{
		owner: "Boss", robby: "Robby", zoe: "ZOË Ann", ibo: "İbo", twin1: "Twin", twin2: "twin",
		sam: "Sam", samSmith: "Sam Smith", outsider: "Outsider",
	} {
		f.profile(k, name)
	}
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Bell\ntrigger: {on: message_posted}\nsteps: [{id: ping, action: send_message, text: '@boss @ROBBY, (@zoë ann) @ibo @Twin @Sam Smith @Outsider {{trigger.text}}'}]")
	f.store(f.sign(owner, ingest.KindChat, "@Sam", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	f.drain(f.engine(time.Minute))
	bells := f.doorbells(run)
	require.Len(t, bells, 1)
	require.Equal(t, []string{pubHex(owner), pubHex(robby), pubHex(zoe), pubHex(ibo), pubHex(samSmith)}, bells[0].Tags.Values("p"))
}

// Resolving against the members the step reads by folded name wakes
// exactly whom resolving against every member of the channel wakes, over
// random names and templates whose characters fold across scripts ("İ"
// and the Kelvin sign fold to ASCII "i" and "k", "ẞ" to "ß"): the
// templates mention members' names spelled with other characters of the
// same fold, run on into more text, and mention names shared by two
// members and names of non-members.
// Mutation killed: mention_fold without the Kelvin sign's pair misses
// members the Go fold wakes.
func TestMentionableWakesWhomEveryMemberWakes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := uuid.MustParse(f.channel(owner))
	other := uuid.MustParse(f.channel(owner))
	rng := rand.New(rand.NewPCG(5, 6))
	pick := func(s string) rune { rs := []rune(s); return rs[rng.IntN(len(rs))] }
	var names []string
	for i := range 40 {
		var sb strings.Builder
		for range rng.IntN(4) + 1 {
			sb.WriteRune(pick("akK\u212AİIiẞß ."))
		}
		names = append(names, sb.String())
		channel := ch
		if i%4 == 0 {
			channel = other
		}
		pubkey := make([]byte, 32)
		pubkey[0], pubkey[1] = 0xEE, byte(i)
		_, err := f.pool.Exec(f.ctx, `INSERT INTO users (community_id, pubkey, display_name) VALUES ($1, $2, $3)`, f.tenant.ID(), pubkey, names[i])
		require.NoError(t, err)
		_, err = f.pool.Exec(f.ctx, `INSERT INTO channel_members (community_id, channel_id, pubkey) VALUES ($1, $2, $3)`, f.tenant.ID(), channel, pubkey)
		require.NoError(t, err)
	}
	// respell writes name with any character of the same fold.
	same := map[rune]string{'k': "kK\u212A", 'K': "kK\u212A", '\u212A': "kK\u212A", 'i': "iIİ", 'I': "iIİ", 'İ': "iIİ", 'ß': "ßẞ", 'ẞ': "ßẞ"}
	respell := func(name string) string {
		var sb strings.Builder
		for _, r := range name {
			if alt, ok := same[r]; ok {
				r = pick(alt)
			}
			sb.WriteRune(r)
		}
		return sb.String()
	}
	q := db.New(f.pool)
	rows, err := q.ChannelMemberDisplayNames(f.ctx, db.ChannelMemberDisplayNamesParams{CommunityID: f.tenant.ID(), ChannelID: ch})
	require.NoError(t, err)
	var everyone []mention.Member
	for _, r := range rows {
		everyone = append(everyone, mention.Member{Pubkey: hex.EncodeToString(r.Pubkey), DisplayName: r.DisplayName})
	}
	woke := 0
	for round := range 500 {
		var sb strings.Builder
		for range rng.IntN(4) + 1 {
			sb.WriteString(string(pick(" (")) + "@" + respell(names[rng.IntN(len(names))]) + string(pick(" .ai")))
		}
		template := sb.String()
		read, err := workflow.Mentionable(f.ctx, q, f.tenant.ID(), ch, template)
		require.NoError(t, err)
		want := mention.Resolve(template, everyone, "")
		require.Equal(t, want, mention.Resolve(template, read, ""), "round %d: template %q", round, template)
		woke += len(want)
	}
	t.Logf("%d members woken by 500 templates", woke)
	require.Greater(t, woke, 100, "templates name members")
}

// rowCounter is a pgx tracer that remembers the most rows any one
// statement returned, and which statement that was.
type rowCounter struct {
	mu      sync.Mutex
	most    int64
	mostSQL string
}

func (c *rowCounter) saw(sql string, tag pgconn.CommandTag) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := tag.RowsAffected(); n > c.most {
		c.most, c.mostSQL = n, sql
	}
}

type sqlKey struct{}

func (c *rowCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, sqlKey{}, d.SQL)
}

func (c *rowCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(sqlKey{}).(string)
	c.saw(sql, d.CommandTag)
}

func (c *rowCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *rowCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.saw(d.SQL, d.CommandTag)
}

func (c *rowCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A send_message step run by the engine reads only the members its
// template could name, whatever the size of its channel: no statement of
// the step returns more than a handful of rows in a channel of 5,000 named
// members, and it still wakes the member it names. Mentionable alone is
// checked by TestStepReadsOnlyTheMembersItsTemplateCouldName; this checks
// the engine's call of it, through the rows each statement the engine
// sends returns.
// Mutation killed: sendMessage reading every member
// (ChannelMemberDisplayNames) for mention.Resolve: one statement returns
// 5,002 rows.
func TestSendMessageStepReadsOnlyTheMembersItsTemplateCouldName(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, robby := f.key(), f.key()
	ch := f.channel(owner, robby)
	f.profile(robby, "Robby")
	const others = 5_000
	f.addMembers(ch, "member", others)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Bell\ntrigger: {on: message_posted}\nsteps: [{id: ping, action: send_message, text: '@Robby please look at {{trigger.text}}'}]")
	f.store(f.sign(owner, ingest.KindChat, "the deploy", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]

	counter := &rowCounter{}
	traced := dbtest.PoolOn(t, f.pool.Config().ConnString(), 4, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter })
	f.drain(workflow.NewEngine(traced, f.p, workflow.EngineOptions{Lease: time.Minute, Clock: clock.Stub(f.clock.Now), Metrics: f.metrics}))

	bells := f.doorbells(run)
	require.Len(t, bells, 1)
	require.Equal(t, []string{pubHex(owner), pubHex(robby)}, bells[0].Tags.Values("p"))
	t.Logf("the most rows one statement of the engine returned in a channel of %d members: %d (%.60q)", others+2, counter.most, counter.mostSQL)
	require.Less(t, counter.most, int64(100), "a statement of the step read the channel's members: %s", counter.mostSQL)
}
