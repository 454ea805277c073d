package ingest_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

type mentionRow struct {
	Pubkey  string
	Channel *uuid.UUID
	Kind    int
}

func (f *fixture) mentions(eventID string) []mentionRow {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, `
		SELECT m.pubkey_hex, m.channel_id, m.event_kind FROM event_mentions m
		JOIN events e ON e.community_id = m.community_id AND e.id = m.event_id AND e.created_at = m.event_created_at
		WHERE m.community_id = $1 AND encode(m.event_id, 'hex') = $2 ORDER BY m.pubkey_hex`, f.tenant.ID(), eventID)
	require.NoError(f.t, err)
	defer rows.Close()
	var out []mentionRow
	for rows.Next() {
		var m mentionRow
		require.NoError(f.t, rows.Scan(&m.Pubkey, &m.Channel, &m.Kind))
		out = append(out, m)
	}
	require.NoError(f.t, rows.Err())
	return out
}

func TestMentionsFromPTags(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "mentions.example", 0)
	alice := f.key()
	ch := f.channel(alice, false)
	chID := uuid.MustParse(ch)
	p1, p2 := fmt.Sprintf("%064x", 1), fmt.Sprintf("%064x", 2)
	noise := nostr.Tags{
		{"p", p2}, {"p", p1}, {"p", p1, "wss://dup.example"}, // duplicate
		{"p", strings.ToUpper(p1[:63]) + "A"}, // upper case
		{"p", p1[:62]},                        // short
		{"p", p1 + "00"},                      // long
		{"p"},                                 // no value
		{"P", p2},                             // not a p tag
	}

	note := f.store(f.sign(alice, 1, "hi", noise, 0))
	require.Equal(t, []mentionRow{{Pubkey: p1, Kind: 1}, {Pubkey: p2, Kind: 1}}, f.mentions(note.ID))
	msg := f.store(f.sign(alice, 9, "hi", append(nostr.Tags{{"h", ch}}, noise...), 0))
	require.Equal(t, []mentionRow{{Pubkey: p1, Channel: &chID, Kind: 9}, {Pubkey: p2, Channel: &chID, Kind: 9}}, f.mentions(msg.ID))

	// Nothing valid, nothing written.
	bare := f.store(f.sign(alice, 1, "no mentions", nostr.Tags{{"p", "nope"}}, 0))
	require.Empty(t, f.mentions(bare.ID))
	// Relay-signed events (the membership notification of a join) get none.
	bob := f.key()
	f.store(f.sign(bob, 9021, "", nostr.Tags{{"h", ch}}, 0))
	require.Zero(t, f.count(`SELECT count(*) FROM event_mentions WHERE event_kind = 44100`))
	require.Equal(t, 4, f.count(`SELECT count(*) FROM event_mentions`))

	// A follow-list-sized event is stored, with the default cap of mention rows.
	many := nostr.Tags{}
	for i := 0; i < 2000; i++ {
		many = append(many, nostr.Tag{"p", fmt.Sprintf("%064x", 1000+i)})
	}
	big := f.store(f.sign(alice, 1, "everyone", many, 0))
	require.Equal(t, ingest.DefaultMaxMentions, f.count(`SELECT count(*) FROM event_mentions WHERE encode(event_id, 'hex') = $1`, big.ID))
}

// Mention rows commit with their event or not at all: a failure at commit,
// after they were written, leaves no event and no mention.
func TestMentionsRollBackWithTheirEvent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "mentions-rollback.example", 0)
	_, err := f.pool.Exec(f.ctx, `
		CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.content = 'boom' THEN RAISE EXCEPTION 'refused at commit'; END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON events
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit();`)
	require.NoError(t, err)
	alice := f.key()
	p := nostr.Tags{{"p", fmt.Sprintf("%064x", 9)}}
	ev := f.sign(alice, 1, "boom", p, 0)
	_, err = f.submit(ev)
	require.ErrorContains(t, err, "refused at commit")
	require.Zero(t, f.count(`SELECT count(*) FROM events`))
	require.Zero(t, f.count(`SELECT count(*) FROM event_mentions`))

	ok := f.store(f.sign(alice, 1, "fine", p, 0))
	require.Len(t, f.mentions(ok.ID), 1)
}
