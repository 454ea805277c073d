package workflow

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// Kinds of the workflow protocol.
const (
	KindDefinition    = 30620 // owner-signed definition, d = workflow UUID
	KindManualTrigger = 46020 // owner-signed command: run a workflow now
)

// DefaultMaxPerChannel bounds the workflows that fire in one channel. Every
// message, reaction and diff in the channel evaluates each one's trigger
// inside its write transaction, and any member may save workflows, so the
// bound is what keeps one event's trigger work bounded.
const DefaultMaxPerChannel = 20

// DefinitionHandler is the ingest handler of kind 30620: the event is
// stored like any addressable event, and in the same transaction its
// workflows row is created or updated, pinned to this event's id. A save
// that would make more than maxPerChannel workflows fire in the channel is
// refused (0: DefaultMaxPerChannel).
func DefinitionHandler(maxPerChannel int) ingest.Handler {
	return (&Triggers{MaxPerChannel: maxPerChannel}).definitionHandler()
}

func (t *Triggers) definitionHandler() ingest.Handler {
	maxPerChannel := t.MaxPerChannel
	if maxPerChannel <= 0 {
		maxPerChannel = DefaultMaxPerChannel
	}
	minSchedule := t.MinScheduleInterval
	if minSchedule <= 0 {
		minSchedule = MinScheduleInterval
	}
	// What Validate parsed, Prepare reads back instead of parsing it
	// again inside the transaction.
	parsed := newDefinitionCache()
	t.savedDefinitions = parsed
	return ingest.Handler{
		Validate: func(ev *nostr.Event) error { return validateDefinition(ev, parsed, minSchedule) },
		Prepare: func(ctx context.Context, w *ingest.Write) error {
			return prepareDefinition(ctx, w, maxPerChannel, parsed, minSchedule)
		},
		Apply: t.applyDefinition,
		// The save locks the channel's row (lockChannelForWorkflows): in a
		// group holding a message's write lock shared, it would wait for a
		// change holding the row and waiting for that lock.
		LocksChannelRow: true,
	}
}

// definitionTags reads the channel (h) and workflow (d) ids.
func definitionTags(ev *nostr.Event) (channel, workflow uuid.UUID, err error) {
	h := ev.Tags.First("h")
	if h == nil {
		return channel, workflow, ingest.Reject("invalid", "missing h tag (channel_id)")
	}
	if channel, err = uuid.Parse(h[1]); err != nil {
		return channel, workflow, ingest.Reject("invalid", "bad channel_id format")
	}
	d := ev.Tags.First("d")
	if d == nil {
		return channel, workflow, ingest.Reject("invalid", "missing d tag (workflow_id)")
	}
	if workflow, err = uuid.Parse(d[1]); err != nil {
		return channel, workflow, ingest.Reject("invalid", "bad workflow_id format")
	}
	return channel, workflow, nil
}

// validateDefinition refuses bad tags and an invalid definition before
// the event joins a group-commit transaction, so parsing never holds the
// transaction other writers share: Prepare reads the definition back from
// parsed (a 50-step definition takes 8 to 20 ms to parse, which it spent
// again under the channel's workflow lock).
func validateDefinition(ev *nostr.Event, parsed *definitionCache, minSchedule time.Duration) error {
	if _, _, err := definitionTags(ev); err != nil {
		return err
	}
	if _, err := parseForSave(ev, parsed, minSchedule); err != nil {
		return parseRejection(err)
	}
	return nil
}

// parseForSave is ParseForSave of ev's content, parsed once per event,
// with minSchedule the shortest time its schedule may leave between slots.
func parseForSave(ev *nostr.Event, parsed *definitionCache, minSchedule time.Duration) (*Definition, error) {
	def, err := parsed.parseEvent(ev)
	if err != nil {
		return nil, err
	}
	if err := checkForSave(def, minSchedule); err != nil {
		return nil, err
	}
	return def, nil
}

func parseRejection(err error) error {
	return ingest.Reject("invalid", "workflow YAML parse error: %v", err)
}

// savedDefinition is what prepareDefinition decided, for applyDefinition.
type savedDefinition struct {
	workflow  uuid.UUID
	existed   bool // a re-save: runs of the earlier definition may wait for approvals
	name      string
	json      []byte
	hash      [32]byte
	newSecret string // set only when this save generated the webhook secret
}

func prepareDefinition(ctx context.Context, w *ingest.Write, maxPerChannel int, parsed *definitionCache, minSchedule time.Duration) error {
	channel, workflowID, err := definitionTags(w.Event)
	if err != nil {
		return err
	}
	// Locked before anything is read: whether this save adds a firing
	// workflow to the channel is decided on what the count sees, and the
	// signer's membership is read after a removal holding the channel
	// (ChannelLockForChange) committed. Read before, a save racing its
	// signer's removal stored an enabled workflow the removal's trigger
	// (workflows_disable_on_owner_removal) never saw. The row before the
	// channel check's write lock, as a change takes them: the other order
	// deadlocks with a change.
	if err := lockChannelForWorkflows(ctx, w, channel); err != nil {
		return err
	}
	// The signer must be an active member of a live, unarchived channel.
	// An unknown channel gets the same answer, so a non-member cannot
	// probe which private channel ids exist.
	access, err := ingest.ChannelAccess(ctx, w.Q, db.ChannelAccessParams{CommunityID: w.Tenant.ID(), ID: channel, Pubkey: w.ActorBytes()})
	if dberr.IsNotFound(err) || (err == nil && access.MemberRole == nil) {
		return ingest.Reject("restricted", "not a member of this channel")
	}
	if err != nil {
		return err
	}
	if access.ArchivedAt != nil {
		return ingest.Reject("restricted", "channel is archived")
	}
	def, err := parseForSave(w.Event, parsed, minSchedule)
	if err != nil {
		return parseRejection(err)
	}
	if def.ReachesOutside() && *access.MemberRole != db.MemberRoleOwner && *access.MemberRole != db.MemberRoleAdmin {
		return ingest.Reject("restricted", "call_webhook needs the owner or admin role in the channel")
	}
	saved := &savedDefinition{workflow: workflowID, name: def.Name}
	if tag := w.Event.Tags.First("name"); tag != nil && tag[1] != "" {
		// The tag overrides the YAML's name and must pass its rule, or the
		// database refuses the row with an answer that says "try again".
		if err := checkName(tag[1], "name tag"); err != nil {
			return ingest.Reject("invalid", "%v", err)
		}
		saved.name = tag[1]
	}
	existing, err := w.Q.WorkflowGet(ctx, db.WorkflowGetParams{CommunityID: w.Tenant.ID(), ID: workflowID, Now: w.SQLNow()})
	switch {
	case dberr.IsNotFound(err):
	case err != nil:
		return err
	case string(existing.OwnerPubkey) != string(w.ActorBytes()) || existing.ChannelID == nil || *existing.ChannelID != channel:
		return ingest.Reject("restricted", "workflow belongs to a different owner or channel")
	default:
		saved.existed = true
	}
	if alreadyFires := err == nil && existing.Status == db.WorkflowStatusActive && existing.Enabled && !existing.DefinitionExpired; !alreadyFires {
		if err := admitToChannel(ctx, w, channel, workflowID, maxPerChannel); err != nil {
			return err
		}
	}
	if def.Trigger.On == OnWebhook {
		// A re-save keeps the secret callers already hold.
		if existing.WebhookSecret != "" {
			def.WebhookSecret = existing.WebhookSecret
		} else {
			def.WebhookSecret = uuid.New().String()
			saved.newSecret = def.WebhookSecret
		}
	}
	if saved.json, err = def.CanonicalJSON(); err != nil {
		return err
	}
	saved.hash = sha256.Sum256(saved.json)
	w.ChannelID = &channel
	w.ReadChannel(channel, access)
	w.SetState(saved)
	return nil
}

// lockChannelForWorkflows serializes the saves of one channel's workflows
// to the end of the transaction, so that concurrent saves count the
// channel's firing workflows one after the other, and a save reads its
// signer's membership after any membership change of the channel.
func lockChannelForWorkflows(ctx context.Context, w *ingest.Write, channel uuid.UUID) error {
	locked, err := w.Q.ChannelLockForWorkflows(ctx, db.ChannelLockForWorkflowsParams{CommunityID: w.Tenant.ID(), ID: channel})
	if err == nil && locked == 0 {
		// No live channel: the answer for an unknown channel.
		return ingest.Reject("restricted", "not a member of this channel")
	}
	return err
}

// admitToChannel refuses a save that would make more than maxPerChannel
// workflows fire in the channel: a new workflow, or one archived or
// disabled (its owner was removed) that the save enables again. A re-save
// of a workflow that already fires adds nothing and is never refused, even
// after the bound was lowered.
func admitToChannel(ctx context.Context, w *ingest.Write, channel, workflowID uuid.UUID, maxPerChannel int) error {
	active, err := w.Q.WorkflowsActiveInChannel(ctx, db.WorkflowsActiveInChannelParams{
		CommunityID: w.Tenant.ID(), ChannelID: channel, ExceptID: workflowID, Now: w.SQLNow(),
	})
	if err != nil {
		return err
	}
	if int(active) >= maxPerChannel {
		return ingest.Reject("restricted", "the channel has its limit of %d active workflows; archive one first", maxPerChannel)
	}
	return nil
}

func (t *Triggers) applyDefinition(ctx context.Context, w *ingest.Write) error {
	saved := w.State().(*savedDefinition)
	id := w.Event.IDBytes()
	_, err := w.Q.WorkflowUpsert(ctx, db.WorkflowUpsertParams{
		CommunityID:       w.Tenant.ID(),
		ID:                saved.workflow,
		Name:              saved.name,
		OwnerPubkey:       w.ActorBytes(),
		ChannelID:         w.ChannelID,
		Definition:        saved.json,
		DefinitionHash:    saved.hash[:],
		DefinitionEventID: id[:],
		Now:               w.SQLNow(),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// Another owner or channel won a race since prepareDefinition read
		// the row: the upsert's WHERE refused to take it over.
		return ingest.Reject("restricted", "workflow belongs to a different owner or channel")
	}
	if err != nil {
		return err
	}
	if saved.existed {
		// Runs waiting for an approval execute the definition they started
		// under, which this save replaced: a grant could only fail them.
		if err := t.withdrawApprovals(ctx, w, saved.workflow, CodeInvalidDefinition,
			"the workflow was saved again while the run waited for approval; the definition it started under is replaced"); err != nil {
			return err
		}
	}
	reply := struct {
		WorkflowID    string `json:"workflow_id"`
		WebhookSecret string `json:"webhook_secret,omitempty"`
	}{saved.workflow.String(), saved.newSecret}
	body, _ := json.Marshal(reply)
	w.Reply("response:" + string(body))
	return nil
}

// DefinitionDeletion archives the workflows whose definitions a kind 5
// deletes, by coordinate (30620:<owner>:<workflow id>) or by the id of the
// event a workflow is pinned to (an e tag), and those whose pinned event a
// moderator's 9005 hides: register it as side rows. Only the owner's own
// coordinates and events count for a kind 5, as for the events. The
// archived workflows' runs waiting for an approval end with it.
func (t *Triggers) DefinitionDeletion() ingest.SideRows {
	return ingest.SideRows{Needs: deletesDefinitions, Apply: t.archiveDeleted}
}

func deletedWorkflows(ev *nostr.Event) []uuid.UUID {
	var out []uuid.UUID
	for _, v := range ev.Tags.Values("a") {
		c, err := nostr.ParseCoordinate(v)
		if err != nil || c.Kind != KindDefinition || c.PubKey != ev.PubKey {
			continue
		}
		if id, err := uuid.Parse(c.D); err == nil {
			out = append(out, id)
		}
	}
	return out
}

func deletesDefinitions(ev *nostr.Event) bool {
	switch ev.Kind {
	case nostr.KindDeletion:
		return len(deletedWorkflows(ev)) > 0 || len(ingest.DeletionTargetIDs(ev)) > 0
	case ingest.KindDeleteEvent:
		return len(ingest.DeletionTargetIDs(ev)) > 0
	}
	return false
}

func (t *Triggers) archiveDeleted(ctx context.Context, w *ingest.Write) error {
	var archived []uuid.UUID
	for _, id := range deletedWorkflows(w.Event) {
		if w.Event.Kind != nostr.KindDeletion {
			break // a coordinate is a kind 5's
		}
		n, err := w.Q.WorkflowArchive(ctx, db.WorkflowArchiveParams{
			CommunityID: w.Tenant.ID(), ID: id, OwnerPubkey: w.ActorBytes(), Now: w.SQLNow(),
		})
		if err != nil {
			return err
		}
		if n > 0 {
			archived = append(archived, id)
		}
	}
	// Deleted by id or hidden, the pinned event is gone as surely as by
	// coordinate: left active, the workflow fired on, every run failing
	// closed (a schedule one per slot, for good).
	if ids := ingest.DeletionTargetIDs(w.Event); len(ids) > 0 {
		params := db.WorkflowsArchiveByDefinitionEventParams{CommunityID: w.Tenant.ID(), EventIds: ids, Now: w.SQLNow()}
		if w.Event.Kind == nostr.KindDeletion {
			author := w.Event.PubKeyBytes()
			params.Author = author[:]
		} else {
			params.ModeratedChannel = w.ChannelID
		}
		byEvent, err := w.Q.WorkflowsArchiveByDefinitionEvent(ctx, params)
		if err != nil {
			return err
		}
		archived = append(archived, byEvent...)
	}
	for _, id := range archived {
		if err := t.withdrawApprovals(ctx, w, id, CodeWorkflowDisabled, "the workflow was archived while the run waited for approval"); err != nil {
			return err
		}
	}
	return nil
}
