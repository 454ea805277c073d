package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nipoa"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// person is one CLI user with a published profile.
type person struct {
	env map[string]string
	kp  keyPair
}

func newPerson(t *testing.T, r *relaytest.Relay, profile string, createdAt int64) person {
	t.Helper()
	env, kp := newUser(t, r)
	key, err := nostr.SecretKeyFromHex(kp.SecretKey)
	require.NoError(t, err)
	c := r.Dial(t, "")
	c.Auth(key)
	require.True(t, c.Publish(c.Sign(0, profile, nil, createdAt)).OK)
	return person{env: env, kp: kp}
}

func setOwner(t *testing.T, r *relaytest.Relay, agent, owner string) {
	t.Helper()
	a, _ := hex.DecodeString(agent)
	o, _ := hex.DecodeString(owner)
	tag, err := r.Pool.Exec(context.Background(), `UPDATE users SET agent_owner_pubkey = $3 WHERE community_id = $1 AND pubkey = $2`, r.CommunityID, a, o)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
}

// authTag signs the NIP-OA attestation "owner vouches for agent".
func authTag(t *testing.T, ownerSecret, ownerPub, agentPub string) string {
	t.Helper()
	key, err := nostr.SecretKeyFromHex(ownerSecret)
	require.NoError(t, err)
	require.Equal(t, ownerPub, key.PublicKeyHex())
	att, err := nipoa.Sign(key, agentPub, "kind=0")
	require.NoError(t, err)
	raw, err := json.Marshal(att.Tag())
	require.NoError(t, err)
	return string(raw)
}

// Two agents both named Honey, owned by Alice and by Bob: "my Honey" is
// users get --name Honey --owner me, which returns only the caller's, with
// the owner's pubkey and display name; someone who owns no Honey gets [],
// never the unscoped result. An agent running the CLI with its owner's
// attestation resolves "me" to that owner.
//
// Mutations killed: the CLI not sending agent_owner (Bob's Honey comes back
// for Alice, and Carol gets both); retrying without the owner on an empty
// answer (Carol gets both); owned_by_me computed from the caller's own key
// for an agent (the agent's lookup says false); owner fields read from the
// profile's own claim instead of the relay's record.
func TestUsersGetOwnerMeFindsMyHoney(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	now := time.Now().Unix()
	alice := newPerson(t, r, `{"name":"alice","display_name":"Alice"}`, now-100)
	bob := newPerson(t, r, `{"name":"bob","display_name":"Bob"}`, now-100)
	carol := newPerson(t, r, `{"name":"carol"}`, now-100)
	// Bob's Honey is newer and claims Alice as owner in its profile: only
	// the relay's record counts.
	aliceHoney := newPerson(t, r, `{"name":"Honey","about":"Alice's bee"}`, now-60)
	bobHoney := newPerson(t, r, `{"name":"Honey","about":"Bob's bee","agent_owner":"`+alice.kp.PubKey+`"}`, now-30)
	setOwner(t, r, aliceHoney.kp.PubKey, alice.kp.PubKey)
	setOwner(t, r, bobHoney.kp.PubKey, bob.kp.PubKey)
	str := func(s string) *string { return &s }
	aliceName, bobName := str("Alice"), str("Bob")
	mine := userJSON{Pubkey: aliceHoney.kp.PubKey, DisplayName: str("Honey"), OwnerPubkey: str(alice.kp.PubKey), OwnerDisplayName: aliceName, OwnedByMe: true}

	var got []userJSON
	buzz(t, alice.env, "", "users", "get", "--name", "Honey", "--owner", "me").ok(t, &got)
	require.Equal(t, []userJSON{mine}, got)

	buzz(t, alice.env, "", "users", "get", "--name", "honey").ok(t, &got)
	require.ElementsMatch(t, []userJSON{mine,
		{Pubkey: bobHoney.kp.PubKey, DisplayName: str("Honey"), OwnerPubkey: str(bob.kp.PubKey), OwnerDisplayName: bobName},
	}, got, "without --owner both come back, told apart by their owners")

	theirs := userJSON{Pubkey: bobHoney.kp.PubKey, DisplayName: str("Honey"), OwnerPubkey: str(bob.kp.PubKey), OwnerDisplayName: bobName}
	bobKey, _ := hex.DecodeString(bob.kp.PubKey)
	for _, owner := range []string{bob.kp.PubKey, strings.ToUpper(bob.kp.PubKey), nostr.EncodeNpub(bobKey)} {
		buzz(t, alice.env, "", "users", "get", "--name", "Honey", "--owner", owner).ok(t, &got)
		require.Equal(t, []userJSON{theirs}, got, owner)
	}

	buzz(t, alice.env, "", "users", "get", "--pubkey", aliceHoney.kp.PubKey, "--pubkey", bobHoney.kp.PubKey, "--owner", "me").ok(t, &got)
	require.Equal(t, []userJSON{mine}, got)

	o := buzz(t, carol.env, "", "users", "get", "--name", "Honey", "--owner", "me")
	require.Equal(t, 0, o.code, o.stderr)
	require.Equal(t, "[]\n", o.stdout, "nothing owned matches: [], not the unscoped answer")

	// No arguments: the caller's own profile, with no recorded owner.
	buzz(t, carol.env, "", "users", "get").ok(t, &got)
	require.Equal(t, []userJSON{{Pubkey: carol.kp.PubKey, DisplayName: str("carol")}}, got)

	// The whole profile with --format json.
	var full []map[string]any
	buzz(t, alice.env, "", "users", "get", "--pubkey", aliceHoney.kp.PubKey, "--format", "json").ok(t, &full)
	require.Equal(t, []map[string]any{{
		"name": "Honey", "about": "Alice's bee", "pubkey": aliceHoney.kp.PubKey,
		"owner_pubkey": alice.kp.PubKey, "owner_display_name": "Alice", "owned_by_me": true,
	}}, full)

	// Alice's Honey asks for "my Honey" as an agent: "me" is its owner.
	agentEnv := map[string]string{}
	for k, v := range aliceHoney.env {
		agentEnv[k] = v
	}
	agentEnv["BUZZ_AUTH_TAG"] = authTag(t, alice.kp.SecretKey, alice.kp.PubKey, aliceHoney.kp.PubKey)
	buzz(t, agentEnv, "", "users", "get", "--name", "Honey", "--owner", "me").ok(t, &got)
	require.Equal(t, []userJSON{mine}, got)

	// An attestation signed by someone else than the owner it names is
	// refused before anything is sent.
	agentEnv["BUZZ_AUTH_TAG"] = strings.Replace(authTag(t, bob.kp.SecretKey, bob.kp.PubKey, aliceHoney.kp.PubKey), bob.kp.PubKey, alice.kp.PubKey, 1)
	e := buzz(t, agentEnv, "", "users", "get", "--name", "Honey", "--owner", "me").fail(t, 2)
	require.Equal(t, "config", e.Code)
	require.Contains(t, e.Error, "BUZZ_AUTH_TAG: auth tag rejected")
}

// Bad arguments are usage errors before any query runs: without a relay
// configured, nothing could have been sent.
func TestUsersGetRefusesBadArguments(t *testing.T) {
	t.Parallel()
	env := map[string]string{"BUZZ_PRIVATE_KEY": strings.Repeat("1", 64)}
	hexKey := strings.Repeat("ab", 32)
	many := []string{"users", "get"}
	for range maxUsersPubkeys + 1 {
		many = append(many, "--pubkey", hexKey)
	}
	for _, tc := range []struct {
		args []string
		code string
		msg  string
	}{
		{[]string{"users", "get", "--owner", "nope"}, "usage", `--owner must be me, a 64-char hex pubkey or an npub, not "nope"`},
		{[]string{"users", "get", "--owner", ""}, "usage", "--owner must be me"},
		{[]string{"users", "get", "--owner", hexKey[:63]}, "usage", "--owner must be me"},
		{[]string{"users", "get", "--owner", "npub1" + strings.Repeat("q", 58)}, "usage", "--owner must be me"},
		{[]string{"users", "get", "--owner", "ME"}, "usage", "--owner must be me"},
		{[]string{"users", "get", "--name", "Honey", "--pubkey", hexKey}, "usage", "--name and --pubkey cannot be combined"},
		{[]string{"users", "get", "--pubkey", "xyz"}, "invalid", "--pubkey must be a 64-char hex pubkey or an npub"},
		{[]string{"users", "get", "--format", "table"}, "usage", "--format must be compact or json"},
		{many, "usage", "at most 200 --pubkey values"},
		{[]string{"users"}, "usage", "missing users subcommand: get"},
	} {
		e := buzz(t, env, "", tc.args...).fail(t, 2)
		require.Equal(t, tc.code, e.Code, tc.args)
		require.Contains(t, e.Error, tc.msg, tc.args)
	}
	var help map[string]string
	buzz(t, nil, "", "users", "get", "--help").ok(t, &help)
	require.Contains(t, help["usage"], "--owner  Filter agents by verified owner (`me`, 64-char hex, or npub)")
}

// An agent running the CLI with BUZZ_AUTH_TAG proves its owner to the relay
// on whichever side it talks to: on AUTH over the WebSocket and as
// X-Auth-Tag on signed HTTP requests, so the relay records the owner and
// "my Honey" lookups by the owner find it. Mutations killed: AUTH without
// the auth tag leaves the first agent unowned; a signed GET without the
// header, or whose NIP-98 event does not sign the tag, leaves the second
// one unowned.
func TestAgentCLIProvesItsOwner(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	now := time.Now().Unix()
	alice := newPerson(t, r, `{"name":"alice"}`, now-100)
	recorded := func(agent string) string {
		t.Helper()
		a, _ := hex.DecodeString(agent)
		var owner []byte
		err := r.Pool.QueryRow(context.Background(), `SELECT agent_owner_pubkey FROM users WHERE community_id = $1 AND pubkey = $2`, r.CommunityID, a).Scan(&owner)
		require.NoError(t, err)
		return hex.EncodeToString(owner)
	}
	asAgent := func(p person) map[string]string {
		env := map[string]string{}
		for k, v := range p.env {
			env[k] = v
		}
		env["BUZZ_AUTH_TAG"] = authTag(t, alice.kp.SecretKey, alice.kp.PubKey, p.kp.PubKey)
		return env
	}

	overWebSocket := newPerson(t, r, `{"name":"Honey"}`, now-50)
	var channels []map[string]any
	buzz(t, asAgent(overWebSocket), "", "channels", "list").ok(t, &channels)
	require.Equal(t, alice.kp.PubKey, recorded(overWebSocket.kp.PubKey), "recorded from the AUTH event")

	overHTTP := newPerson(t, r, `{"name":"Bumble"}`, now-50)
	buzz(t, asAgent(overHTTP), "", "workflows", "runs", "00000000-0000-4000-8000-000000000000").fail(t, 3)
	require.Equal(t, alice.kp.PubKey, recorded(overHTTP.kp.PubKey), "recorded from the X-Auth-Tag header")
}
