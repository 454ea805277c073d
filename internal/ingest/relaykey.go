package ingest

import (
	"context"
	"encoding/hex"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// RelayKey returns the community's relay signing key, creating it on first
// use. The database decides which key wins when two processes race.
func (p *Pipeline) RelayKey(ctx context.Context, community uuid.UUID) (*nostr.SecretKey, error) {
	return p.relayKey(ctx, community)
}

func (p *Pipeline) relayKey(ctx context.Context, community uuid.UUID) (*nostr.SecretKey, error) {
	p.keysMu.Lock()
	key := p.keys[community]
	p.keysMu.Unlock()
	if key != nil {
		return key, nil
	}
	// Read first: once the key exists, nothing is written, so a relay
	// starting while the community is being deleted still gets it.
	stored, err := db.New(p.pool).CommunitySigningKey(ctx, community)
	if err != nil {
		return nil, err
	}
	if len(stored) > 0 {
		return p.cacheKey(community, stored)
	}
	candidate, err := nostr.GenerateSecretKey()
	if err != nil {
		return nil, err
	}
	raw, err := hex.DecodeString(candidate.Hex())
	if err != nil {
		return nil, err
	}
	// On the pool, not the event's transaction: the key outlives any one event.
	stored, err = db.New(p.pool).CommunitySigningKeyEnsure(ctx, db.CommunitySigningKeyEnsureParams{ID: community, Candidate: raw})
	if err != nil {
		return nil, err
	}
	return p.cacheKey(community, stored)
}

func (p *Pipeline) cacheKey(community uuid.UUID, stored []byte) (*nostr.SecretKey, error) {
	key, err := nostr.SecretKeyFromHex(hex.EncodeToString(stored))
	if err != nil {
		return nil, err
	}
	p.keysMu.Lock()
	p.keys[community] = key
	p.keysMu.Unlock()
	return key, nil
}

// RelayWrite starts a Write for relay-signed events that no client event
// caused (a workflow step, say): Emit, EmitWaking and EmitReaction through
// it store them in q's transaction, and PublishEmitted fans them out once
// that committed.
func (p *Pipeline) RelayWrite(communityID uuid.UUID, q *db.Queries) *Write {
	return &Write{Tenant: community.FromRow(db.Community{ID: communityID}), Q: q, pipeline: p}
}

// PublishEmitted fans out the events emitted through w, then runs the
// write's after-commit work (such as handing EmitWaking's outbox rows to
// this process's listener worker), in the order a client event's commit
// runs them. Call it only after their transaction committed, and never
// after a rollback.
func (w *Write) PublishEmitted() {
	for _, e := range w.emitted {
		w.pipeline.publish(w, e.ev, e.channel)
	}
	for _, fn := range w.afterCommit {
		fn()
	}
}

// Discard runs the write's rollback steps (such as giving back the outbox
// hand-off room EmitWaking's rows reserved): call it once their transaction
// rolled back, instead of PublishEmitted. Nil-safe.
func (w *Write) Discard() {
	if w != nil {
		w.rolledBack()
	}
}

// LastEmitted is the event the last Emit stored, or nil.
func (w *Write) LastEmitted() *nostr.Event {
	if len(w.emitted) == 0 {
		return nil
	}
	return w.emitted[len(w.emitted)-1].ev
}
