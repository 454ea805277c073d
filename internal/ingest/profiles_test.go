package ingest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

type userRow struct {
	DisplayName, About, Avatar, Nip05 *string
	Policy                            string
	Owner                             string
	EventID                           string
	CreatedAt                         time.Time
}

func (f *fixture) user(key *nostr.SecretKey) (userRow, bool) {
	f.t.Helper()
	var u userRow
	rows, err := f.pool.Query(f.ctx, `
		SELECT display_name, about, avatar_url, nip05_handle, channel_add_policy::text,
		       coalesce(encode(agent_owner_pubkey, 'hex'), ''), encode(metadata_event_id, 'hex'), metadata_created_at
		FROM users WHERE community_id = $1 AND encode(pubkey, 'hex') = $2`, f.tenant.ID(), key.PublicKeyHex())
	require.NoError(f.t, err)
	defer rows.Close()
	if !rows.Next() {
		return u, false
	}
	require.NoError(f.t, rows.Scan(&u.DisplayName, &u.About, &u.Avatar, &u.Nip05, &u.Policy, &u.Owner, &u.EventID, &u.CreatedAt))
	return u, true
}

func ptr(s string) *string { return &s }

func TestProfileSyncsIntoUsers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "profiles.example", 0)
	agent, owner := f.key(), f.key()

	v1 := f.store(f.sign(agent, 0, `{"name":"honey","about":"bee","picture":"https://x.example/h.png","nip05":"Honey@Profiles.Example:443",
		"channel_add_policy":"owner_only","agent_owner":"`+owner.PublicKeyHex()+`"}`, nil, f.base))
	u, ok := f.user(agent)
	require.True(t, ok)
	// A self-declared agent_owner is content, not an owner: only the owner's
	// signed attestation records one.
	require.Equal(t, userRow{DisplayName: ptr("honey"), About: ptr("bee"), Avatar: ptr("https://x.example/h.png"),
		Nip05: ptr("Honey@Profiles.Example:443"), Policy: "owner_only",
		EventID: v1.ID, CreatedAt: time.Unix(f.base, 0)}, u)

	// display_name wins over name; an off-domain NIP-05 is cleared; the
	// policy stays when a newer profile does not name it.
	v2 := f.store(f.sign(agent, 0, `{"name":"n","display_name":"Honey Bee","nip05":"honey@elsewhere.example"}`, nil, f.base+10))
	u, _ = f.user(agent)
	require.Equal(t, userRow{DisplayName: ptr("Honey Bee"), Policy: "owner_only",
		EventID: v2.ID, CreatedAt: time.Unix(f.base+10, 0)}, u)

	// An older version changes nothing (the slot keeps the newest).
	out, err := f.submit(f.sign(agent, 0, `{"name":"old"}`, nil, f.base+5))
	require.NoError(t, err)
	require.Equal(t, ingest.Superseded, out, "an older profile is not stored")
	u, _ = f.user(agent)
	require.Equal(t, v2.ID, u.EventID)

	// Malformed content is accepted; the row keeps only which event it mirrors.
	v3 := f.store(f.sign(agent, 0, `{not json`, nil, f.base+20))
	u, _ = f.user(agent)
	require.Equal(t, userRow{Policy: "owner_only", EventID: v3.ID, CreatedAt: time.Unix(f.base+20, 0)}, u)
	f.store(f.sign(agent, 0, `{"name":"nul\u0000inside","about":42,"channel_add_policy":"nobody"}`, nil, f.base+30))
	u, _ = f.user(agent)
	require.Nil(t, u.DisplayName, "values PostgreSQL text cannot hold are dropped")
	require.Nil(t, u.About, "non-string values are ignored")
	require.Equal(t, "nobody", u.Policy)

	// A fresh user with a bare-domain NIP-05 on this host and no Buzz keys.
	plain := f.key()
	f.store(f.sign(plain, 0, `{"display_name":"","name":"Plain","nip05":"profiles.example"}`, nil, 0))
	u, _ = f.user(plain)
	require.Equal(t, ptr("Plain"), u.DisplayName)
	require.Equal(t, ptr("profiles.example"), u.Nip05)
	require.Equal(t, "anyone", u.Policy)
	require.Empty(t, u.Owner)
}

func TestProfileRejectsBadBuzzKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "profiles-bad.example", 0)
	key := f.key()
	const policyErr = "invalid: channel_add_policy must be anyone, owner_only or nobody"
	for _, content := range []string{
		`{"channel_add_policy":"everyone"}`,
		`{"channel_add_policy":"Nobody"}`,
		`{"channel_add_policy":""}`,
		`{"channel_add_policy":null}`,
		`{"channel_add_policy":1}`,
	} {
		f.rejected(f.sign(key, 0, content, nil, 0), policyErr)
	}
	_, ok := f.user(key)
	require.False(t, ok)
}

// A community vouches only for NIP-05 identifiers naming exactly its host,
// port included: an identifier without a port names the domain's default
// https port, which is another community when this one has a port of its
// own (relay.example and relay.example:8443 are two tenants). Both sides are
// normalized alike (case, one trailing dot, a default port, the loopback
// literals).
// Mutation killed: comparing hosts without their ports (the community at
// localhost:7777 kept bob@localhost and bob@localhost:9999, and the one on
// the default port kept alice@...:8443).
func TestNip05HostMatching(t *testing.T) {
	t.Parallel()
	for host, cases := range map[string]map[string]bool{
		"localhost:7777": {
			"bob@localhost:7777":     true,
			"bob@LOCALHOST:7777":     true,
			"bob@127.0.0.1:7777":     true,
			"_@localhost:7777.":      true,
			"localhost:7777":         true,
			"bob@localhost":          false,
			"bob@localhost.":         false,
			"bob@LOCALHOST:9999":     false,
			"bob@localhost:443":      false,
			"bob@localhost.example":  false,
			"bob@":                   false,
			"bob@evil.example":       false,
			"localhost@evil.example": false,
		},
		"nip05-default.example": {
			"alice@nip05-default.example":      true,
			"alice@Nip05-Default.Example:443":  true,
			"nip05-default.example.":           true,
			"alice@nip05-default.example:8443": false,
			"alice@nip05-default.example:80:8": false,
		},
	} {
		t.Run(host, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, host, 0)
			for nip05, kept := range cases {
				key := f.key()
				f.store(f.sign(key, 0, `{"nip05":"`+nip05+`"}`, nil, 0))
				u, _ := f.user(key)
				if kept {
					require.Equal(t, ptr(nip05), u.Nip05, "%s on %s is vouched for", nip05, host)
				} else {
					require.Nil(t, u.Nip05, "%s on %s is not this community's to vouch for", nip05, host)
				}
			}
		})
	}
}

// A profile its author deletes (NIP-09, by id or by its 0:<pubkey>:
// address) leaves users with no display name, about, picture or NIP-05:
// the deleted name no longer answers owner lookups or wakes its member
// by @name. The member's add policy stays; a newer profile fills the row
// again. Another member's profile is untouched.
// Mutation killed: no users_forget_hidden_profile trigger (the deleted
// display name stays).
func TestDeletedProfileLeavesUsers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "deleted-profile.example", 0)
	byID, byAddress, bystander := f.key(), f.key(), f.key()
	profile := func(key *nostr.SecretKey, name string, at int64) *nostr.Event {
		return f.store(f.sign(key, 0, `{"name":"`+name+`","about":"a","picture":"https://x.example/p.png","channel_add_policy":"nobody"}`, nil, at))
	}
	v1 := profile(byID, "first", f.base)
	profile(byAddress, "second", f.base)
	profile(bystander, "third", f.base)

	f.store(f.sign(byID, nostr.KindDeletion, "", nostr.Tags{{"e", v1.ID}}, f.base+1))
	f.store(f.sign(byAddress, nostr.KindDeletion, "", nostr.Tags{{"a", "0:" + byAddress.PublicKeyHex() + ":"}}, f.base+1))
	for _, key := range []*nostr.SecretKey{byID, byAddress} {
		u, ok := f.user(key)
		require.True(t, ok, "the row stays")
		require.Nil(t, u.DisplayName, "the deleted display name is gone")
		require.Nil(t, u.About)
		require.Nil(t, u.Avatar)
		require.Equal(t, "nobody", u.Policy, "the member's add policy is not profile text")
	}
	u, _ := f.user(bystander)
	require.Equal(t, ptr("third"), u.DisplayName, "another member's profile is untouched")

	profile(byID, "again", f.base+2)
	u, _ = f.user(byID)
	require.Equal(t, ptr("again"), u.DisplayName, "a newer profile fills the row again")
}
