package relay_test

import (
	"encoding/hex"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// startOnAStoppedClock starts a relay whose clock reads now (unix seconds,
// start at first) and an authenticated client of it.
func startOnAStoppedClock(t *testing.T) (r *relaytest.Relay, c *relaytest.Client, now *atomic.Int64, start time.Time) {
	t.Helper()
	now = new(atomic.Int64)
	start = time.Now().Truncate(time.Second)
	now.Store(start.Unix())
	stub := clock.Stub(func() time.Time { return time.Unix(now.Load(), 0) })
	r = relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(stub)})
	c = r.Dial(t, "")
	c.Auth(nil)
	return r, c, now, start
}

// The purge deletes the rows of expired events (NIP-40) and counts them,
// and leaves the rest: events not expired yet, events without an
// expiration. Mutations killed: a purge that deletes nothing (rows stay,
// metric 0); one that ignores expires_at (the unexpired rows go).
func TestPurgeDeletesExpiredRowsOnly(t *testing.T) {
	t.Parallel()
	r, c, now, start := startOnAStoppedClock(t)
	exp := func(d time.Duration) nostr.Tags {
		return nostr.Tags{{"expiration", strconv.FormatInt(start.Add(d).Unix(), 10)}}
	}
	hour := c.Sign(1, "an hour", exp(time.Hour), start.Unix())
	day := c.Sign(1, "a day", exp(24*time.Hour), start.Unix())
	forever := c.Sign(1, "forever", nil, start.Unix())
	for _, ev := range []*nostr.Event{hour, day, forever} {
		require.True(t, c.Publish(ev).OK)
	}
	stored := func() []string {
		rows, err := r.Pool.Query(t.Context(), `SELECT encode(id, 'hex') FROM events WHERE community_id = $1 AND kind = 1`, r.CommunityID)
		require.NoError(t, err)
		var ids []string
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rows.Err())
		return ids
	}

	require.Zero(t, r.Server.PurgeExpired(t.Context()))
	require.Len(t, stored(), 3)

	now.Store(start.Add(2 * time.Hour).Unix())
	require.EqualValues(t, 1, r.Server.PurgeExpired(t.Context()))
	require.ElementsMatch(t, []string{day.ID, forever.ID}, stored())
	require.Equal(t, 1.0, testutil.ToFloat64(r.Server.Metrics().EventsExpiredPurged))

	now.Store(start.Add(48 * time.Hour).Unix())
	require.EqualValues(t, 1, r.Server.PurgeExpired(t.Context()))
	require.Equal(t, []string{forever.ID}, stored())
	require.Equal(t, 2.0, testutil.ToFloat64(r.Server.Metrics().EventsExpiredPurged))
}

// Purging an expired event takes what its hiding takes: an expired
// reaction's row in reactions (else the reactor's next reaction with that
// emoji is refused as a duplicate, forever) and an expired profile's
// fields mirrored in users. Mutation killed: a purge that only deletes the
// rows (the reaction is refused, the display name stays).
func TestPurgeOfExpiredReactionAndProfileClearsWhatTheyWrote(t *testing.T) {
	t.Parallel()
	r, c, now, start := startOnAStoppedClock(t)
	pub := c.Key.PublicKey()
	author := hex.EncodeToString(pub[:])
	inAnHour := nostr.Tag{"expiration", strconv.FormatInt(start.Add(time.Hour).Unix(), 10)}

	target := c.Sign(1, "react to me", nil, start.Unix())
	require.True(t, c.Publish(target).OK)
	react := func(extra ...nostr.Tag) nostr.Tags {
		return append(nostr.Tags{{"e", target.ID}, {"p", author}}, extra...)
	}
	r1 := c.Publish(c.Sign(7, "+", react(inAnHour), start.Unix()))
	require.True(t, r1.OK, r1.Msg)
	profile := c.Sign(0, `{"name":"fleeting"}`, nostr.Tags{inAnHour}, start.Unix())
	require.True(t, c.Publish(profile).OK)
	displayName := func() *string {
		var name *string
		require.NoError(t, r.Pool.QueryRow(t.Context(),
			`SELECT display_name FROM users WHERE community_id = $1 AND pubkey = $2`, r.CommunityID, pub[:]).Scan(&name))
		return name
	}
	require.Equal(t, "fleeting", *displayName())

	now.Store(start.Add(2 * time.Hour).Unix())
	require.EqualValues(t, 2, r.Server.PurgeExpired(t.Context()))
	require.Nil(t, displayName(), "an expired profile's name is still mirrored in users")
	again := c.Publish(c.Sign(7, "+", react(), now.Load()))
	require.True(t, again.OK, "the reactor's next reaction: %s", again.Msg)
}

// A deletion request's expiration is not stored: the deletion stays, so an
// older version of the address it deleted is still refused after the
// expiration has passed and the purge has run. Mutation killed: kind 5
// stored with its expires_at (the purge takes the deletion, and the old
// version is accepted).
func TestExpiringDeletionKeepsItsAddressDeleted(t *testing.T) {
	t.Parallel()
	r, c, now, start := startOnAStoppedClock(t)
	address := "30023:" + c.Key.PublicKeyHex() + ":notes"
	require.True(t, c.Publish(c.Sign(30023, "v2", nostr.Tags{{"d", "notes"}}, start.Unix()-10)).OK)
	deletion := c.Sign(5, "", nostr.Tags{{"a", address}, {"expiration", strconv.FormatInt(start.Add(time.Hour).Unix(), 10)}}, start.Unix())
	require.True(t, c.Publish(deletion).OK)
	served := func() []*nostr.Event { return c.Req("address", map[string]any{"kinds": []int{30023}}) }
	require.Empty(t, served())

	now.Store(start.Add(2 * time.Hour).Unix())
	require.Zero(t, r.Server.PurgeExpired(t.Context()))
	c.Publish(c.Sign(30023, "v1", nostr.Tags{{"d", "notes"}}, start.Unix()-20)) // accepted as superseded, not stored
	require.Empty(t, served(), "an older version once the deletion's expiration passed")
	require.Equal(t, []string{deletion.ID}, ids(c.Req("deletions", map[string]any{"kinds": []int{5}})))
}

// An expiration not written as created_at is (a sign, a leading zero, a
// space) is refused with a clear answer rather than read as the number
// strconv makes of it; the digits alone are taken. Mutation killed:
// parsing with strconv.ParseInt alone ("+..." and "0..." stored).
func TestExpirationMustBeDigits(t *testing.T) {
	t.Parallel()
	_, c, _, start := startOnAStoppedClock(t)
	later := strconv.FormatInt(start.Add(time.Hour).Unix(), 10)
	for _, value := range []string{"+" + later, "0" + later, " " + later} {
		got := c.Publish(c.Sign(1, "expiration "+value, nostr.Tags{{"expiration", value}}, start.Unix()))
		require.False(t, got.OK, "%q", value)
		require.Equal(t, "invalid: the expiration tag must hold a unix time in seconds, in decimal digits without sign, spaces or leading zeros (NIP-40)", got.Msg, "%q", value)
	}
	got := c.Publish(c.Sign(1, "expiration "+later, nostr.Tags{{"expiration", later}}, start.Unix()))
	require.True(t, got.OK, got.Msg)
	far := c.Publish(c.Sign(1, "expiration far away", nostr.Tags{{"expiration", "99999999999999999"}}, start.Unix()))
	require.True(t, far.OK, far.Msg)
}

// A replaceable or addressable slot whose newest version has expired
// holds nothing, for the writes as for the reads, whether or not the purge
// has deleted the row yet: an older version arriving then is stored and
// served, as it is once the purge has run, not answered "duplicate: ... a
// newer version of its address is already stored" and dropped while a REQ
// returns nothing for the slot. The head's expiry is put in the past on
// the database's clock, which the slot's trigger judges by (the purge
// deletes by it too), and the relay's, which its reads judge by; no purge
// runs. Until then the older version is kept out, as before.
// Mutation killed: the head lookups of events_keep_newest_version
// ignoring expires_at, as they did (the older version is answered as a
// duplicate, nothing is served), in the replaceable branch or the
// addressable one (each slot is checked).
func TestAnExpiredHeadKeepsNoOlderVersionOut(t *testing.T) {
	t.Parallel()
	r, c, now, start := startOnAStoppedClock(t)
	expiresIn := func(d time.Duration) nostr.Tag {
		return nostr.Tag{"expiration", strconv.FormatInt(start.Add(d).Unix(), 10)}
	}
	for _, slot := range []struct {
		kind int
		tags nostr.Tags
	}{{10002, nil}, {30023, nostr.Tags{{"d", "notes"}}}} {
		head := c.Sign(slot.kind, "newest", append(slices.Clone(slot.tags), expiresIn(time.Hour)), start.Unix())
		older := c.Sign(slot.kind, "older", slices.Clone(slot.tags), start.Unix()-10)
		served := func() []string { return ids(c.Req("slot", map[string]any{"kinds": []int{slot.kind}})) }
		require.True(t, c.Publish(head).OK)
		reply := c.Publish(older)
		require.True(t, reply.OK)
		require.Contains(t, reply.Msg, "duplicate:", "kind %d: the head is live", slot.kind)
		require.Equal(t, []string{head.ID}, served())

		_, err := r.Pool.Exec(t.Context(), `UPDATE events SET expires_at = now() - interval '1 second'
			WHERE community_id = $1 AND id = decode($2, 'hex')`, r.CommunityID, head.ID)
		require.NoError(t, err)
		now.Store(start.Add(2 * time.Hour).Unix())
		require.Empty(t, served(), "kind %d: the expired head is not served", slot.kind)

		reply = c.Publish(older)
		require.True(t, reply.OK, "kind %d: %s", slot.kind, reply.Msg)
		require.Empty(t, reply.Msg, "kind %d: the older version, the head expired", slot.kind)
		require.Equal(t, []string{older.ID}, served(), "kind %d", slot.kind)
		var rows int
		require.NoError(t, r.Pool.QueryRow(t.Context(), `SELECT count(*) FROM events WHERE community_id = $1 AND kind = $2`,
			r.CommunityID, slot.kind).Scan(&rows))
		require.Equal(t, 1, rows, "kind %d: the expired head's row went with the slot's other versions", slot.kind)
		now.Store(start.Unix())
	}
}

// A profile whose newest version expired leaves the users mirror to the
// older version that takes its slot: the slot's trigger deletes the
// expired row as it stores the older one, so no purge hides it afterwards
// to clear what it mirrored, and the mirror, which took only a newer
// version than the one it held, kept the expired display name for good,
// still matched by agent owner lookups and @name mentions while every
// read served the older profile. Expiry is put in the past on both
// clocks, as in TestAnExpiredHeadKeepsNoOlderVersionOut.
// Mutation killed: UserProfileSync without its "the version mirrored is
// no longer stored" arm (the display name stays "fleeting").
func TestAnExpiredProfileLeavesTheMirrorToTheVersionServed(t *testing.T) {
	t.Parallel()
	r, c, now, start := startOnAStoppedClock(t)
	pub := c.Key.PublicKey()
	displayName := func() *string {
		var name *string
		require.NoError(t, r.Pool.QueryRow(t.Context(),
			`SELECT display_name FROM users WHERE community_id = $1 AND pubkey = $2`, r.CommunityID, pub[:]).Scan(&name))
		return name
	}
	older := c.Sign(0, `{"name":"lasting"}`, nil, start.Unix()-10)
	require.True(t, c.Publish(older).OK)
	inAnHour := nostr.Tag{"expiration", strconv.FormatInt(start.Add(time.Hour).Unix(), 10)}
	head := c.Sign(0, `{"name":"fleeting"}`, nostr.Tags{inAnHour}, start.Unix())
	require.True(t, c.Publish(head).OK)
	require.Equal(t, "fleeting", *displayName())

	_, err := r.Pool.Exec(t.Context(), `UPDATE events SET expires_at = now() - interval '1 second'
		WHERE community_id = $1 AND id = decode($2, 'hex')`, r.CommunityID, head.ID)
	require.NoError(t, err)
	now.Store(start.Add(2 * time.Hour).Unix())
	reply := c.Publish(older)
	require.True(t, reply.OK, reply.Msg)
	require.Empty(t, reply.Msg, "the older profile is stored, the head expired")
	require.Equal(t, []string{older.ID}, ids(c.Req("profile", map[string]any{"kinds": []int{0}})))
	require.NotNil(t, displayName())
	require.Equal(t, "lasting", *displayName(), "users mirrors the profile served, not the expired one")

	require.Zero(t, r.Server.PurgeExpired(t.Context()), "the expired row went with the slot")
	require.Equal(t, "lasting", *displayName())
}

// An expired event is as unknown to a reaction or a reply as one never
// stored, whether or not the purge has removed its row yet: a reaction to
// it, or a reply naming it as parent, gets the answer an unknown target
// gets, so whoever holds its id cannot tell an expired event the purge has
// not reached yet (which no read serves) from a purged one, nor attach a
// reaction or a thread row to it. Posted through the HTTP bridge (net/http),
// signed at the relay's stopped clock, an hour past the expiration.
// Mutation killed: EventReactionTarget and ThreadParentLookup without the
// expires_at condition (the reaction and the reply are stored, 200 and
// accepted).
func TestExpiredEventTakesNoReactionOrReply(t *testing.T) {
	t.Parallel()
	r, owner, now, start := startOnAStoppedClock(t)
	ch := createChannel(t, owner, "open", false)
	expiring := nostr.Tags{{"h", ch}, {"expiration", strconv.FormatInt(start.Add(time.Hour).Unix(), 10)}}
	target := owner.Sign(9, "soon gone", expiring, start.Unix())
	require.True(t, owner.Publish(target).OK)
	now.Store(start.Add(2 * time.Hour).Unix())

	reader := relaytest.NewKey(t)
	at := func(ev *nostr.Event) { ev.CreatedAt = now.Load() }
	postAt := func(ev *nostr.Event) bridgeReply {
		body := encodeBody(t, ev)
		return send(t, r, "", "/events", authHeader(nip98(t, reader, "POST", r.HTTPURL+"/events", body, at)), body)
	}
	reaction := relaytest.SignEvent(t, reader, 7, "+", nostr.Tags{{"e", target.ID}, {"p", target.PubKey}}, now.Load())
	got := postAt(reaction)
	require.Equal(t, http.StatusBadRequest, got.Status, got.Raw)
	require.Equal(t, "invalid: reaction target event not found", got.Msg)
	reply := relaytest.SignEvent(t, reader, 9, "late", nostr.Tags{{"h", ch}, {"e", target.ID, "", "reply"}}, now.Load())
	got = postAt(reply)
	require.Equal(t, http.StatusBadRequest, got.Status, got.Raw)
	require.Equal(t, "invalid: reply parent not found", got.Msg)
}

// A reaction or a reply names an event by the relay's clock, as a read
// judges it, not by the database's: those lookups bound the database's
// now() on the wall clock (their now parameter NULL), so with the
// database's clock ten minutes behind the relay's, an event expired a
// minute ago by the relay's clock, which no REQ returns and the purge (by
// the database's clock) has not removed, still took a reaction and a
// reply, and its id still told an expired row from a purged one. The
// relay runs on the wall clock here, over WebSocket (go-nostr's wire
// through relaytest), the database's clock shifted by a function shadowing
// now() on the relay's search_path.
// Mutation killed: EventReactionTarget and ThreadParentLookup given
// w.SQLNow() again (the reaction and the reply are accepted).
func TestExpiryOfAnEventNamedByAWriteIsJudgedByTheRelaysClock(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	_, err := pool.Exec(t.Context(), `
		CREATE SCHEMA skew;
		CREATE FUNCTION skew.now() RETURNS timestamptz LANGUAGE plpgsql STABLE AS
		$$BEGIN RETURN pg_catalog.now() - interval '10 minutes'; END$$`)
	require.NoError(t, err)
	behind := dbtest.PoolOn(t, pool.Config().ConnString(), 4, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["search_path"] = "skew,pg_catalog,public"
	})
	r := relaytest.StartWith(t, behind, nil)
	owner := r.Dial(t, "")
	key := owner.Auth(nil)
	ch := createChannel(t, owner, "open", false)
	now := time.Now()
	aMinuteAgo := strconv.FormatInt(now.Add(-time.Minute).Unix(), 10)
	expired := relaytest.SignEvent(t, key, 9, "gone by the relay's clock", nostr.Tags{{"h", ch}, {"expiration", aMinuteAgo}}, now.Add(-time.Hour).Unix())
	storeOld(t, pool.Config().ConnString(), r.CommunityID, ch, expired)
	require.Empty(t, owner.Req("history", map[string]any{"#h": []string{ch}, "kinds": []int{9}}), "a REQ judges by the relay's clock")

	reader := r.Dial(t, "")
	reader.Auth(nil)
	got := reader.Publish(reader.Sign(7, "+", nostr.Tags{{"e", expired.ID}, {"p", expired.PubKey}}, 0))
	require.False(t, got.OK, "a reaction to an event expired by the relay's clock was stored")
	require.Equal(t, "invalid: reaction target event not found", got.Msg)
	got = reader.Publish(reader.Sign(9, "late", nostr.Tags{{"h", ch}, {"e", expired.ID, "", "reply"}}, 0))
	require.False(t, got.OK, "a reply to an event expired by the relay's clock was stored")
	require.Equal(t, "invalid: reply parent not found", got.Msg)
}
