package workflow

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow/condition"
	"github.com/buzzrelay/buzz/internal/workflow/template"
)

// Kinds that trigger workflows, besides the manual command.
const (
	kindChat     = 9
	kindReaction = 7
	kindDiff     = 40008
)

// Cause kinds: what started a run.
const (
	CauseEvent    = "event"
	CauseCommand  = "command"
	CauseSchedule = "schedule"
	CauseWebhook  = "webhook"
)

// Cause is the one typed reason a run exists. Ref is the trigger event id
// (hex) for event and command causes, the slot's Unix second for a
// schedule, and empty for a webhook.
type Cause struct {
	Kind string `json:"kind"`
	Ref  string `json:"ref"`
}

// TriggerContext is stored with a run (workflow_runs.trigger_context): the
// values templates and conditions see, the definition event the run is
// pinned to, and its cause.
type TriggerContext struct {
	Text              string            `json:"text"`
	Author            string            `json:"author"`
	ChannelID         string            `json:"channel_id"`
	Timestamp         string            `json:"timestamp"`
	Emoji             string            `json:"emoji,omitempty"`
	MessageID         string            `json:"message_id,omitempty"`
	RootMessageID     string            `json:"root_message_id,omitempty"`
	ParentMessageID   string            `json:"parent_message_id,omitempty"`
	WebhookFields     map[string]string `json:"webhook_fields"`
	DefinitionEventID string            `json:"definition_event_id"`
	Cause             Cause             `json:"cause"`
	// Depth is how many workflows' call_webhook steps led to this run
	// through webhook triggers (0: none); see MaxWebhookDepth.
	Depth int `json:"depth,omitempty"`
}

// Template is the template and condition view of the context plus the
// outputs of the steps done so far.
func (tc TriggerContext) Template(steps map[string]map[string]any) template.Context {
	trigger := map[string]string{}
	// Webhook fields first, so the standard fields win a name clash.
	for k, v := range tc.WebhookFields {
		trigger[k] = v
	}
	for k, v := range map[string]string{
		"text": tc.Text, "author": tc.Author, "channel_id": tc.ChannelID, "timestamp": tc.Timestamp,
		"emoji": tc.Emoji, "message_id": tc.MessageID, "root_message_id": tc.RootMessageID,
		"parent_message_id": tc.ParentMessageID,
	} {
		trigger[k] = v
	}
	if steps == nil {
		steps = map[string]map[string]any{}
	}
	return template.Context{Trigger: trigger, Steps: steps}
}

// ConditionFunc evaluates a filter or if expression against a context.
type ConditionFunc func(ctx context.Context, expr string, tc template.Context) (bool, error)

// Triggers creates runs for the events that fire workflows, in the
// triggering event's transaction, and hands their ids to a worker after
// commit.
type Triggers struct {
	// Condition evaluates trigger filters; an error skips the workflow.
	Condition ConditionFunc
	// Offer receives the ids of runs created by a committed event, and
	// their community (a Worker's Offer); nil leaves them to the worker's
	// poll.
	Offer func(community uuid.UUID, ids []uuid.UUID)
	// MaxUnfinishedRuns bounds each workflow's unfinished runs; a trigger
	// beyond it records its run failed with capacity_exceeded (0: the
	// default).
	MaxUnfinishedRuns int
	// MaxPerChannel bounds the workflows that fire in one channel; a save
	// beyond it is refused (0: DefaultMaxPerChannel).
	MaxPerChannel int
	// Metrics counts runs that end inside a trigger's transaction (refused
	// at capacity, denied); may be nil.
	Metrics *Metrics
	// MinScheduleInterval is the shortest time a schedule saved may leave
	// between two slots (0: MinScheduleInterval); a cron expression is
	// asked for at most a minute.
	MinScheduleInterval time.Duration

	// savedDefinitions hands the definitions a save's Validate parsed to
	// its Prepare.
	savedDefinitions *definitionCache
}

// triggerKind maps an event kind to the trigger it fires.
func triggerKind(kind int) string {
	switch kind {
	case kindChat:
		return OnMessagePosted
	case kindReaction:
		return OnReactionAdded
	case kindDiff:
		return OnDiffPosted
	}
	return ""
}

// firesWorkflows is the side rows' cheap test. Only messages, reactions
// and diffs fire workflows: lifecycle kinds (46001-46012), gift wraps and
// commands never do. Relay-signed events (a workflow's own messages, which
// carry a buzz:workflow tag) never reach side rows at all, so a workflow
// cannot trigger itself.
func firesWorkflows(ev *nostr.Event) bool { return triggerKind(ev.Kind) != "" }

// SideRows returns the run-creating side rows to register on the pipeline.
func (t *Triggers) SideRows() ingest.SideRows {
	return ingest.SideRows{Needs: firesWorkflows, Apply: t.createRuns}
}

func (t *Triggers) createRuns(ctx context.Context, w *ingest.Write) error {
	if w.ChannelID == nil {
		return nil
	}
	rows, err := w.Q.WorkflowsTriggerable(ctx, db.WorkflowsTriggerableParams{CommunityID: w.Tenant.ID(), ChannelID: *w.ChannelID, Now: w.SQLNow()})
	if err != nil || len(rows) == 0 {
		return err
	}
	base := EventContext(w.Event, *w.ChannelID)
	// Every filter here runs inside the event's write transaction, which
	// other events share: together they get one evaluation's limits.
	ctx = condition.WithShare(ctx, len(rows))
	var created []uuid.UUID
	for _, row := range rows {
		def := Definition{Enabled: row.DefinitionEnabled}
		if err := json.Unmarshal(row.Trigger, &def.Trigger); err != nil {
			continue // a row that no longer decodes fires nothing
		}
		tc := base
		tc.DefinitionEventID = hex.EncodeToString(row.DefinitionEventID)
		if !Fires(ctx, &def, w.Event.Kind, tc, t.condition) {
			continue
		}
		id, queued, err := t.createRun(ctx, w, row.ID, tc)
		if err != nil {
			return err
		}
		if queued {
			created = append(created, id)
		}
	}
	t.offerAfterCommit(w, created)
	return nil
}

// Fires reports whether def's trigger fires for an event of kind whose
// trigger context is tc: the definition is enabled, its trigger is the
// event's kind, a reaction carries exactly its emoji, and its filter
// evaluates true (an evaluation error does not fire). An agent verifying a
// doorbell asks the same question of the event it refetched.
func Fires(ctx context.Context, def *Definition, kind int, tc TriggerContext, cond ConditionFunc) bool {
	on := triggerKind(kind)
	if on == "" || !def.Enabled || def.Trigger.On != on {
		return false
	}
	if on == OnReactionAdded && def.Trigger.Emoji != "" && def.Trigger.Emoji != tc.Emoji {
		return false
	}
	if def.Trigger.Filter != "" {
		ok, err := cond(ctx, def.Trigger.Filter, tc.Template(nil))
		if err != nil || !ok {
			return false
		}
	}
	return true
}

func (t *Triggers) condition(ctx context.Context, expr string, tc template.Context) (bool, error) {
	if t.Condition == nil {
		return false, errNoConditions
	}
	return t.Condition(ctx, expr, tc)
}

func (t *Triggers) offerAfterCommit(w *ingest.Write, ids []uuid.UUID) {
	if len(ids) > 0 && t.Offer != nil {
		w.AfterCommit(func() { t.Offer(w.Tenant.ID(), ids) })
	}
}

// createRun admits a run of the triggering event in its transaction and
// reports whether it was queued; a run refused at capacity is counted once
// the event commits.
func (t *Triggers) createRun(ctx context.Context, w *ingest.Write, workflowID uuid.UUID, tc TriggerContext) (uuid.UUID, bool, error) {
	eventID := w.Event.IDBytes()
	id, queued, err := admitRun(ctx, w.Q, newRun{
		CommunityID: w.Tenant.ID(), WorkflowID: workflowID, TriggerEventID: eventID[:], Context: tc, Now: w.SQLNow(),
	}, t.MaxUnfinishedRuns)
	if err == nil && !queued {
		w.AfterCommit(t.Metrics.refusedAtCapacity)
	}
	return id, queued, err
}

// EventContext is the trigger context of a message, reaction or diff in
// channel (without the pinned definition, which the run adds). The author
// is the signer: only client-signed events trigger, and any tag naming
// someone else is the poster's word, not proof.
func EventContext(ev *nostr.Event, channel uuid.UUID) TriggerContext {
	tc := TriggerContext{
		Text:          ev.Content,
		Author:        ev.PubKey,
		ChannelID:     channel.String(),
		Timestamp:     strconv.FormatInt(ev.CreatedAt, 10),
		MessageID:     ev.ID,
		WebhookFields: map[string]string{},
		Cause:         Cause{Kind: CauseEvent, Ref: ev.ID},
	}
	if ev.Kind == kindReaction {
		tc.Emoji = ev.Content
		for i := len(ev.Tags) - 1; i >= 0; i-- {
			if tag := ev.Tags[i]; len(tag) >= 2 && tag[0] == "e" {
				if _, ok := nostr.DecodeHex32(tag[1]); ok {
					tc.MessageID = tag[1]
					break
				}
			}
		}
	}
	if ev.Kind != kindReaction {
		tc.RootMessageID, tc.ParentMessageID = nostr.ThreadRefs(ev.Tags)
	}
	return tc
}

// ManualTrigger is the handler of kind 46020: the workflow's owner runs it
// now. The command is stored in the workflow's channel and the run is
// created in the same transaction; the OK message carries its id as
// response:{"run_id":"<uuid>"}.
func (t *Triggers) ManualTrigger() ingest.Handler {
	return ingest.Handler{Validate: validateManual, Prepare: prepareManual, Apply: t.applyManual}
}

// manualTarget reads the workflow id from the d tag, else an e tag.
func manualTarget(ev *nostr.Event) (uuid.UUID, error) {
	tag := ev.Tags.First("d")
	if tag == nil {
		tag = ev.Tags.First("e")
	}
	if tag == nil {
		return uuid.Nil, ingest.Reject("invalid", "missing d tag (workflow_id)")
	}
	id, err := uuid.Parse(tag[1])
	if err != nil {
		return uuid.Nil, ingest.Reject("invalid", "bad workflow_id format")
	}
	return id, nil
}

func validateManual(ev *nostr.Event) error {
	_, err := manualTarget(ev)
	return err
}

type manualRun struct {
	workflow          uuid.UUID
	definitionEventID []byte
}

func prepareManual(ctx context.Context, w *ingest.Write) error {
	id, _ := manualTarget(w.Event)
	row, err := w.Q.WorkflowGet(ctx, db.WorkflowGetParams{CommunityID: w.Tenant.ID(), ID: id, Now: w.SQLNow()})
	if dberr.IsNotFound(err) {
		return ingest.Reject("invalid", "workflow not found")
	}
	if err != nil {
		return err
	}
	if string(row.OwnerPubkey) != string(w.ActorBytes()) {
		// Whoever cannot read the workflow's channel is told what an
		// unknown id gets, so a refusal does not confirm that it exists.
		readable, err := channelReadable(ctx, w, row.ChannelID)
		if err != nil {
			return err
		}
		if !readable {
			return ingest.Reject("invalid", "workflow not found")
		}
		return ingest.Reject("restricted", "not authorized to trigger this workflow")
	}
	if row.ChannelID == nil {
		return ingest.Reject("invalid", "workflow is not channel-scoped")
	}
	// The command is stored in the workflow's channel, so its owner must
	// still be allowed to write there like any event with an h tag; an
	// owner who is not (removed from a private channel) is told what an
	// unknown id gets.
	if err := bindWriteOrHide(ctx, w, *row.ChannelID, "workflow not found"); err != nil {
		return err
	}
	if row.Status != db.WorkflowStatusActive || !row.Enabled {
		return ingest.Reject("invalid", "workflow is %s", workflowState(row))
	}
	if row.DefinitionExpired {
		return ingest.Reject("invalid", "%s", definitionExpired)
	}
	w.SetState(&manualRun{workflow: id, definitionEventID: row.DefinitionEventID})
	return nil
}

// definitionExpired is the refusal of a workflow whose definition event's
// NIP-40 expiration passed: it fires nothing until saved again.
const definitionExpired = "the workflow's definition expired (NIP-40); save it again to run it"

func workflowState(row db.WorkflowGetRow) string {
	if row.Status == db.WorkflowStatusActive {
		return "disabled"
	}
	return string(row.Status)
}

// bindWriteOrHide binds the write to channel if its actor may write there.
// One to whom the channel is unknown (a private channel they are not in)
// gets "invalid: <notFound>", the answer for an unknown workflow or
// approval, so the refusal does not confirm that it exists; any other
// refusal (an archived channel its reader knows of) is passed on.
func bindWriteOrHide(ctx context.Context, w *ingest.Write, channel uuid.UUID, notFound string) error {
	err := ingest.BindChannelForWrite(ctx, w, channel)
	if ingest.IsUnknownChannel(err) {
		return ingest.Reject("invalid", "%s", notFound)
	}
	return err
}

func (t *Triggers) applyManual(ctx context.Context, w *ingest.Write) error {
	m := w.State().(*manualRun)
	tc := TriggerContext{
		Author:            w.Event.PubKey,
		ChannelID:         w.ChannelID.String(),
		Timestamp:         strconv.FormatInt(w.Event.CreatedAt, 10),
		WebhookFields:     map[string]string{},
		DefinitionEventID: hex.EncodeToString(m.definitionEventID),
		Cause:             Cause{Kind: CauseCommand, Ref: w.Event.ID},
	}
	id, queued, err := t.createRun(ctx, w, m.workflow, tc)
	if err != nil {
		return err
	}
	if !queued {
		// The command is stored and its run recorded failed: the owner
		// sees why in the reply and in the run history.
		w.Reply(`response:{"run_id":"` + id.String() + `","status":"failed","error_code":"` + string(CodeCapacityExceeded) + `"}`)
		return nil
	}
	w.Reply(`response:{"run_id":"` + id.String() + `"}`)
	t.offerAfterCommit(w, []uuid.UUID{id})
	return nil
}

// channelReadable reports whether the write's actor may read channel (nil:
// no channel, readable by nobody).
func channelReadable(ctx context.Context, w *ingest.Write, channel *uuid.UUID) (bool, error) {
	if channel == nil {
		return false, nil
	}
	access, err := ingest.ChannelAccess(ctx, w.Q, db.ChannelAccessParams{CommunityID: w.Tenant.ID(), ID: *channel, Pubkey: w.ActorBytes()})
	if dberr.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return canRead(access), nil
}

// canRead reports whether a channel's access row lets its pubkey read it:
// open to all, or private and the pubkey an active member.
func canRead(access db.ChannelAccessRow) bool {
	return access.MemberRole != nil || access.Visibility == db.ChannelVisibilityOpen
}
