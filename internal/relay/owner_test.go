package relay_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nipoa"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// attest returns owner's attestation tag for agent under conditions.
func attest(t *testing.T, owner *nostr.SecretKey, agent, conditions string) nostr.Tag {
	t.Helper()
	a, err := nipoa.Sign(owner, agent, conditions)
	require.NoError(t, err)
	return a.Tag()
}

// authWith sends an AUTH as key carrying extra tags and returns the OK; on
// success the client speaks as key.
func authWith(t *testing.T, c *relaytest.Client, key *nostr.SecretKey, extra ...nostr.Tag) relaytest.Reply {
	t.Helper()
	ev := c.AuthEvent(key)
	ev.Tags = append(ev.Tags, extra...)
	require.NoError(t, ev.Sign(key))
	c.Send("AUTH", ev)
	ok := c.Expect("OK")
	require.Equal(t, ev.ID, ok.ID)
	if ok.OK {
		c.Key = key
	}
	return ok
}

// recordedOwner reads the agent's recorded owner in r's home community, ""
// when none.
func recordedOwner(t *testing.T, r *relaytest.Relay, agent string) string {
	t.Helper()
	var owner string
	err := r.Pool.QueryRow(context.Background(), `
		SELECT coalesce(encode(agent_owner_pubkey, 'hex'), '') FROM users
		WHERE community_id = $1 AND pubkey = decode($2, 'hex')`, r.CommunityID, agent).Scan(&owner)
	if err != nil {
		require.ErrorContains(t, err, "no rows")
		return ""
	}
	return owner
}

// An agent's owner comes only from its owner's signed attestation on AUTH,
// first wins: a later profile naming another owner, and a later AUTH with a
// different owner's attestation, change nothing (the latter authenticates
// without an owner and is told why). owner_only then admits the verified
// owner and refuses someone the agent merely names in its profile.
//
// Mutations killed: recording agent_owner from kind 0 again (the profile
// step changes the owner, and carol can add the agent); an overwriting
// upsert (the second attestation replaces bob); ignoring the auth tag on
// AUTH (nothing is recorded, bob is refused).
func TestOwnerAttestationOnAuthIsFirstWins(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	alice := r.Dial(t, "")
	alice.Auth(nil)
	bob := r.Dial(t, "")
	bob.Auth(nil)
	carol := r.Dial(t, "")
	carol.Auth(nil)
	agentKey := relaytest.NewKey(t)
	agent := agentKey.PublicKeyHex()

	honey := r.Dial(t, "")
	ok := authWith(t, honey, agentKey, attest(t, bob.Key, agent, "created_at>1000000000"))
	require.True(t, ok.OK, ok.Msg)
	require.Empty(t, ok.Msg, "a recorded owner needs no note")
	require.Equal(t, bob.Key.PublicKeyHex(), recordedOwner(t, r, agent))

	// The agent names carol in its profile: content, not an owner.
	profile := fmt.Sprintf(`{"name":"honey","channel_add_policy":"owner_only","agent_owner":%q}`, carol.Key.PublicKeyHex())
	ok = honey.Publish(honey.Sign(0, profile, nil, 0))
	require.True(t, ok.OK, ok.Msg)
	require.Equal(t, bob.Key.PublicKeyHex(), recordedOwner(t, r, agent))

	// Carol's own attestation does not replace bob either, and that session
	// has no owner.
	second := r.Dial(t, "")
	ok = authWith(t, second, agentKey, attest(t, carol.Key, agent, ""))
	require.True(t, ok.OK, "the key is proven, only the owner claim is refused: %s", ok.Msg)
	require.Contains(t, ok.Msg, "owner attestation not applied")
	require.Equal(t, bob.Key.PublicKeyHex(), recordedOwner(t, r, agent))
	// Bob's attestation again is fine (idempotent) and gives an owner.
	ok = authWith(t, r.Dial(t, ""), agentKey, attest(t, bob.Key, agent, ""))
	require.True(t, ok.OK, ok.Msg)
	require.Empty(t, ok.Msg)

	ch := sidesChannel(t, alice)
	for _, admin := range []*relaytest.Client{bob, carol} {
		ok := alice.Publish(alice.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", admin.Key.PublicKeyHex(), "admin"}}, 0))
		require.True(t, ok.OK, ok.Msg)
	}
	requirePrefix(t, putUser(carol, ch, agentKey), "blocked: ")
	requirePrefix(t, putUser(alice, ch, agentKey), "blocked: ")
	ok = putUser(bob, ch, agentKey)
	require.True(t, ok.OK, ok.Msg)
}

// A bad auth tag fails the AUTH with invalid: naming the problem; the
// connection survives and authenticates without one.
//
// Mutations killed: skipping the tag check on AUTH (each case would be
// accepted); accepting two tags; skipping the created_at conditions.
func TestOwnerAttestationOnAuthRefusesBadTags(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := relaytest.NewKey(t)
	other := relaytest.NewKey(t)
	agentKey := relaytest.NewKey(t)
	agent := agentKey.PublicKeyHex()
	good := attest(t, owner, agent, "")
	forgedSig := append(nostr.Tag{}, good...)
	forgedSig[3] = attest(t, owner, other.PublicKeyHex(), "")[3]
	c := r.Dial(t, "")
	for _, tc := range []struct {
		name string
		tags []nostr.Tag
		msg  string
	}{
		{"two auth tags", []nostr.Tag{good, good}, "invalid: malformed auth tag: an event may carry at most one auth tag"},
		{"three elements", []nostr.Tag{good[:3]}, "invalid: malformed auth tag: must have exactly 4 elements"},
		{"trailing &", []nostr.Tag{{"auth", owner.PublicKeyHex(), "kind=1&", good[3]}}, "invalid: malformed auth tag: conditions have an empty clause"},
		{"leading zero", []nostr.Tag{{"auth", owner.PublicKeyHex(), "kind=01", good[3]}}, "invalid: malformed auth tag: clause \"kind=01\" needs a canonical decimal"},
		{"signed for another agent", []nostr.Tag{forgedSig}, "invalid: auth tag rejected: the owner's signature does not authorize agent"},
		{"self-attestation", []nostr.Tag{attest(t, agentKey, agent, "")}, "invalid: auth tag rejected: the owner must not be the agent itself"},
		{"expired", []nostr.Tag{attest(t, owner, agent, "created_at<1000000000")}, "invalid: auth tag rejected: condition created_at<1000000000 does not allow"},
	} {
		ok := authWith(t, c, agentKey, tc.tags...)
		require.False(t, ok.OK, tc.name)
		require.True(t, strings.HasPrefix(ok.Msg, tc.msg), "%s: %q", tc.name, ok.Msg)
	}
	require.Empty(t, recordedOwner(t, r, agent))
	// Still connected: AUTH without a tag works, and records no owner.
	ok := authWith(t, c, agentKey)
	require.True(t, ok.OK, ok.Msg)
	require.Empty(t, recordedOwner(t, r, agent))
	require.True(t, c.Publish(c.Sign(1, "still here", nil, 0)).OK)
}

// sendWithTag is send with an x-auth-tag header (omitted when tag is "").
func sendWithTag(t *testing.T, r *relaytest.Relay, method, path, authorization, tag string, body []byte) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, r.HTTPURL+path, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", authorization)
	if tag != "" {
		req.Header.Set("X-Auth-Tag", tag)
	}
	resp, err := bridgeHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	return resp.StatusCode, out
}

func tagJSON(t *testing.T, tag nostr.Tag) string {
	t.Helper()
	b, err := json.Marshal(tag)
	require.NoError(t, err)
	return string(b)
}

// The x-auth-tag header of NIP-98 requests is verified against the request's
// signer: a good one that the request's NIP-98 event also signs records the
// owner (first wins, like AUTH), a malformed one is 400 and one that does
// not authorize the signer is 401, each naming the problem, on /events,
// /query, /count and the run-history routes alike.
//
// A header the NIP-98 event does not sign records nothing (the request is
// served): the owner's signature names the agent, not the request, so
// whoever held one of the agent's headers unused could otherwise attach an
// attestation of their own and own the agent for good. A signed auth tag
// that differs from the header is 401.
//
// Mutations killed: ignoring the header (no owner recorded, bad headers
// served 200); verifying it against the wrong key; recording over an
// existing owner; recording from a header the request did not sign;
// accepting a signed tag that differs from the header.
func TestOwnerAttestationHeaderOnHTTP(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner, other := relaytest.NewKey(t), relaytest.NewKey(t)
	agentKey := relaytest.NewKey(t)
	agent := agentKey.PublicKeyHex()
	goodTag := attest(t, owner, agent, "")
	good := tagJSON(t, goodTag)
	signing := func(tag nostr.Tag) func(*nostr.Event) {
		return func(ev *nostr.Event) { ev.Tags = append(ev.Tags, tag) }
	}
	doSigned := func(method, path, tag string, body []byte, mutate func(*nostr.Event)) (int, map[string]any) {
		return sendWithTag(t, r, method, path, authHeader(nip98(t, agentKey, method, r.HTTPURL+path, body, mutate)), tag, body)
	}
	do := func(method, path, tag string, body []byte) (int, map[string]any) {
		return doSigned(method, path, tag, body, nil)
	}
	filters := encodeBody(t, query(map[string]any{"kinds": []int{1}}))

	// Someone else's attestation on a header the agent signed without it.
	status, out := do("POST", "/query", tagJSON(t, attest(t, other, agent, "")), filters)
	require.Equal(t, http.StatusOK, status, out)
	require.Empty(t, recordedOwner(t, r, agent), "an unsigned header records no owner")

	status, out = doSigned("POST", "/query", good, filters, signing(attest(t, other, agent, "")))
	require.Equal(t, http.StatusUnauthorized, status, out)
	require.Equal(t, "auth-required: x-auth-tag header: auth tag rejected: the request's signed event carries a different auth tag", out["error"])
	require.Empty(t, recordedOwner(t, r, agent))

	status, out = doSigned("POST", "/query", good, filters, signing(goodTag))
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, owner.PublicKeyHex(), recordedOwner(t, r, agent))

	// Once recorded, the header alone confirms it (and changes nothing).
	status, out = do("POST", "/query", good, filters)
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, owner.PublicKeyHex(), recordedOwner(t, r, agent))

	wrongAgent := tagJSON(t, attest(t, owner, other.PublicKeyHex(), ""))
	for _, route := range []struct{ method, path string }{
		{"POST", "/events"}, {"POST", "/query"}, {"POST", "/count"},
		{"GET", "/workflows/00000000-0000-4000-8000-000000000001/runs"},
		{"GET", "/workflows/00000000-0000-4000-8000-000000000001/runs/00000000-0000-4000-8000-000000000002/approvals"},
	} {
		var body []byte
		if route.method == "POST" {
			body = filters
		}
		for _, tc := range []struct {
			tag    string
			status int
			msg    string
		}{
			{`["auth"]`, http.StatusBadRequest, "invalid: x-auth-tag header: malformed auth tag: must have exactly 4 elements"},
			{`not json`, http.StatusBadRequest, "invalid: x-auth-tag header: malformed auth tag: must be a JSON array of strings"},
			{wrongAgent, http.StatusUnauthorized, "auth-required: x-auth-tag header: auth tag rejected: the owner's signature does not authorize agent " + agent},
		} {
			status, out := do(route.method, route.path, tc.tag, body)
			require.Equal(t, tc.status, status, "%s %s %s: %v", route.method, route.path, tc.tag, out)
			require.True(t, strings.HasPrefix(fmt.Sprint(out["error"]), tc.msg), "%s: %v", route.path, out)
		}
	}

	// Another owner's header never replaces the first; the request is served.
	otherTag := attest(t, other, agent, "")
	status, out = doSigned("POST", "/count", tagJSON(t, otherTag), filters, signing(otherTag))
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, owner.PublicKeyHex(), recordedOwner(t, r, agent))
}

// Recording is first-wins in SQL: of many concurrent attestations naming
// different owners exactly one is recorded and every caller is told which;
// the database itself refuses to change a recorded owner or to make an
// agent its own owner, and deleting the owner's row clears the link.
//
// Mutations killed: DO UPDATE SET agent_owner_pubkey = EXCLUDED... (the
// last writer wins, callers disagree); dropping the trigger, the CHECK or
// the foreign key.
func TestOwnerRecordIsFirstWinsInSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := relaytest.Start(t)
	q := db.New(r.Pool)
	agent := relaytest.NewKey(t).PublicKey()
	const racers = 8
	owners := make([][32]byte, racers)
	for i := range owners {
		owners[i] = relaytest.NewKey(t).PublicKey()
	}
	got := make([][]byte, racers)
	var wg sync.WaitGroup
	for i := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, err := q.UserAgentOwnerRecord(ctx, db.UserAgentOwnerRecordParams{CommunityID: r.CommunityID, Agent: agent[:], Owner: owners[i][:]})
			if err == nil {
				got[i] = rec
			}
		}()
	}
	wg.Wait()
	winners := 0
	for i := range owners {
		require.NotNil(t, got[i], "every caller learns the recorded owner")
		require.Equal(t, got[0], got[i], "every caller sees the same owner")
		if bytes.Equal(got[i], owners[i][:]) {
			winners++
		}
	}
	require.Equal(t, 1, winners)
	var stored []byte
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT agent_owner_pubkey FROM users WHERE community_id = $1 AND pubkey = $2`, r.CommunityID, agent[:]).Scan(&stored))
	require.Equal(t, got[0], stored)

	_, err := r.Pool.Exec(ctx, `UPDATE users SET agent_owner_pubkey = $3 WHERE community_id = $1 AND pubkey = $2`, r.CommunityID, agent[:], owners[racers-1][:])
	if bytes.Equal(stored, owners[racers-1][:]) {
		_, err = r.Pool.Exec(ctx, `UPDATE users SET agent_owner_pubkey = $3 WHERE community_id = $1 AND pubkey = $2`, r.CommunityID, agent[:], owners[0][:])
	}
	v, ok := dberr.AsViolation(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "users_agent_owner_first_wins", v.Constraint)

	self := relaytest.NewKey(t).PublicKey()
	_, err = r.Pool.Exec(ctx, `INSERT INTO users (community_id, pubkey, agent_owner_pubkey) VALUES ($1, $2, $2)`, r.CommunityID, self[:])
	v, ok = dberr.AsViolation(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "users_agent_owner_not_self", v.Constraint)

	stranger := relaytest.NewKey(t).PublicKey()
	_, err = r.Pool.Exec(ctx, `INSERT INTO users (community_id, pubkey, agent_owner_pubkey) VALUES ($1, $2, $3)`, r.CommunityID, self[:], stranger[:])
	v, ok = dberr.AsViolation(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "users_agent_owner_fkey", v.Constraint)

	_, err = r.Pool.Exec(ctx, `DELETE FROM users WHERE community_id = $1 AND pubkey = $2`, r.CommunityID, stored)
	require.NoError(t, err)
	require.Empty(t, recordedOwner(t, r, hex.EncodeToString(agent[:])), "deleting the owner clears the link, nothing else")
}

// The doc's correction of a wrong owner, run as written under psql: the
// owner is cleared, the wrong owner can no longer add the owner_only agent,
// and the agent's next AUTH with the right owner's attestation records it.
// Setting the right owner directly instead is refused by the database.
func TestClearingAWrongOwnerByTheAgentsDoc(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := relaytest.Start(t)
	alice := r.Dial(t, "")
	alice.Auth(nil)
	wrong, right := r.Dial(t, ""), r.Dial(t, "")
	wrong.Auth(nil)
	right.Auth(nil)
	agentKey := relaytest.NewKey(t)
	agent := agentKey.PublicKeyHex()
	honey := r.Dial(t, "")
	ok := authWith(t, honey, agentKey, attest(t, wrong.Key, agent, ""))
	require.True(t, ok.OK, ok.Msg)
	ok = honey.Publish(honey.Sign(0, `{"name":"honey","channel_add_policy":"owner_only"}`, nil, 0))
	require.True(t, ok.OK, ok.Msg)
	require.Equal(t, wrong.Key.PublicKeyHex(), recordedOwner(t, r, agent))

	_, err := r.Pool.Exec(ctx, `UPDATE users SET agent_owner_pubkey = decode($3, 'hex') WHERE community_id = $1 AND pubkey = decode($2, 'hex')`,
		r.CommunityID, agent, right.Key.PublicKeyHex())
	v, isViolation := dberr.AsViolation(err)
	require.True(t, isViolation, "%v", err)
	require.Equal(t, "users_agent_owner_first_wins", v.Constraint, "an owner is cleared, never replaced")

	clear := dbtest.SQLBlock(t, "../../docs/agents.md", "-- Clear an agent's recorded owner.")
	cmd := exec.Command(dbtest.PsqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-v", "host="+r.Host, "-v", "agent="+agent,
		"-f", "-", dbtest.PsqlURL(t, r.Pool.Config().ConnString()))
	cmd.Stdin = strings.NewReader(clear)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), agent, "the agent's row comes back")
	require.Contains(t, string(out), "(1 row)")
	require.Empty(t, recordedOwner(t, r, agent))

	ch := sidesChannel(t, alice)
	for _, admin := range []*relaytest.Client{wrong, right} {
		ok := alice.Publish(alice.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", admin.Key.PublicKeyHex(), "admin"}}, 0))
		require.True(t, ok.OK, ok.Msg)
	}
	requirePrefix(t, putUser(wrong, ch, agentKey), "blocked: ")

	ok = authWith(t, r.Dial(t, ""), agentKey, attest(t, right.Key, agent, ""))
	require.True(t, ok.OK, ok.Msg)
	require.Empty(t, ok.Msg, "the right owner is recorded, no conflict")
	require.Equal(t, right.Key.PublicKeyHex(), recordedOwner(t, r, agent))
	ok = putUser(right, ch, agentKey)
	require.True(t, ok.OK, ok.Msg)
}

// An owner recorded from an attestation bounded by created_at<T stops
// counting at T: the recorded-owner route answers 404, owner_only refuses
// the owner, and an agent_owner read no longer finds the agent. The owner's
// renewed attestation, on the agent's next AUTH, makes it count again.
//
// Mutations killed: the route without the end (200 after T); the add
// policy's owner without it (bob adds the agent after T); the read filter
// without it (the agent is found); a record that keeps its end when the
// same owner attests again (404 after the renewal).
func TestOwnerStopsCountingWhenItsAttestationEnds(t *testing.T) {
	t.Parallel()
	start := time.Now().Truncate(time.Second)
	var now atomic.Int64
	now.Store(start.Unix())
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(clock.Stub(func() time.Time { return time.Unix(now.Load(), 0) }))})
	alice := r.Dial(t, "")
	alice.Auth(nil)
	bob := r.Dial(t, "")
	bob.Auth(nil)
	agentKey := relaytest.NewKey(t)
	agent := agentKey.PublicKeyHex()
	ends := start.Unix() + 30

	honey := r.Dial(t, "")
	ok := authWith(t, honey, agentKey, attest(t, bob.Key, agent, fmt.Sprintf("created_at<%d", ends)))
	require.True(t, ok.OK, ok.Msg)
	ok = honey.Publish(honey.Sign(0, `{"name":"honey","channel_add_policy":"owner_only"}`, nil, 0))
	require.True(t, ok.OK, ok.Msg)
	route := "/v1/users/" + agent + "/recorded-owner"
	status, raw := getAuthed(t, r, alice.Key, route)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	owned := func() string {
		t.Helper()
		got := post(t, r, alice.Key, "/query", query(map[string]any{"kinds": []int{0}, "agent_owner": bob.Key.PublicKeyHex()}))
		require.Equal(t, http.StatusOK, got.Status, got.Raw)
		return got.Raw
	}
	require.Contains(t, owned(), agent)

	now.Store(ends)
	status, raw = getAuthed(t, r, alice.Key, route)
	require.Equal(t, http.StatusNotFound, status, "%s", raw)
	ch := sidesChannel(t, alice)
	ok = alice.Publish(alice.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", bob.Key.PublicKeyHex(), "admin"}}, 0))
	require.True(t, ok.OK, ok.Msg)
	requirePrefix(t, putUser(bob, ch, agentKey), "blocked: ")
	// Reads go by the database's clock, which the stub does not move.
	_, err := r.Pool.Exec(context.Background(), `UPDATE users SET agent_owner_until = now() - interval '1 second'
		WHERE community_id = $1 AND pubkey = decode($2, 'hex')`, r.CommunityID, agent)
	require.NoError(t, err)
	require.NotContains(t, owned(), agent)

	ok = authWith(t, r.Dial(t, ""), agentKey, attest(t, bob.Key, agent, fmt.Sprintf("created_at<%d", ends+3600)))
	require.True(t, ok.OK, ok.Msg)
	require.Empty(t, ok.Msg, "the same owner, renewed")
	status, raw = getAuthed(t, r, alice.Key, route)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.Contains(t, owned(), agent)
	ok = putUser(bob, ch, agentKey)
	require.True(t, ok.OK, ok.Msg)
}
