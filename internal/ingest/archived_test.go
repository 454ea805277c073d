package ingest_test

import (
	"testing"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// An archived channel's membership is frozen like its messages: a join, a
// leave, an add or a removal is refused with the answer a message gets, and
// writes no member row and no list. Before, the membership kinds took the
// channel's lock and never looked at archived_at: anyone could join an
// archived open channel and an admin could add users to a private one.
// Mutation killed: lockChannel's callers not checking archived_at.
func TestArchivedChannelRefusesMembershipChanges(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "archived-members.example", 0)
	owner, member, outsider, added := f.key(), f.key(), f.key(), f.key()
	ch := f.channel(owner, false)
	f.store(f.sign(member, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	_, err := f.pool.Exec(f.ctx, `UPDATE channels SET archived_at = now() WHERE id = $1`, ch)
	if err != nil {
		t.Fatal(err)
	}
	members := f.count(`SELECT count(*) FROM channel_members WHERE channel_id = $1 AND removed_at IS NULL`, ch)
	lists := f.count(`SELECT count(*) FROM events WHERE kind = ANY($1::int[])`, ingest.RelayOnlyKinds)

	const archived = "restricted: channel is archived"
	f.rejected(f.sign(f.key(), ingest.KindChat, "hi", nostr.Tags{{"h", ch}}, 0), archived) // as before
	f.rejected(f.sign(outsider, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0), archived)
	f.rejected(f.sign(member, ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}}, 0), archived)
	f.rejected(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", added.PublicKeyHex()}}, 0), archived)
	f.rejected(f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0), archived)

	if got := f.count(`SELECT count(*) FROM channel_members WHERE channel_id = $1 AND removed_at IS NULL`, ch); got != members {
		t.Fatalf("active members %d, want %d", got, members)
	}
	if got := f.count(`SELECT count(*) FROM events WHERE kind = ANY($1::int[])`, ingest.RelayOnlyKinds); got != lists {
		t.Fatalf("relay-signed events %d, want %d", got, lists)
	}
}

// A private archived channel still answers an outsider as an unknown
// channel: the archive must not tell them it exists.
func TestArchivedPrivateChannelStaysUnknownToOutsiders(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "archived-private.example", 0)
	owner := f.key()
	ch := f.channel(owner, true)
	if _, err := f.pool.Exec(f.ctx, `UPDATE channels SET archived_at = now() WHERE id = $1`, ch); err != nil {
		t.Fatal(err)
	}
	f.rejected(f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0), "restricted: channel does not exist or is private to its members")
}
