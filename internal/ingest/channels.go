package ingest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// NIP-29 kinds. Channels are groups whose id (the h tag) is a UUID.
const (
	KindChat          = 9
	KindPutUser       = 9000
	KindRemoveUser    = 9001
	KindEditMetadata  = 9002
	KindDeleteEvent   = 9005
	KindCreateGroup   = 9007
	KindDeleteGroup   = 9008
	KindJoinRequest   = 9021
	KindLeaveRequest  = 9022
	KindGroupMetadata = 39000
	KindGroupAdmins   = 39001
	KindGroupMembers  = 39002
	KindGroupRoles    = 39003
	KindMemberAdded   = nostr.KindMemberAdded
	KindMemberRemoved = nostr.KindMemberRemoved
)

// RelayOnlyKinds are signed by the community's relay key; clients may not
// publish them. The relay writes no roles list (39003), but NIP-29 clients
// read it beside the other lists by the channel's d tag, so a client's
// would stand among them as if the relay's.
var RelayOnlyKinds = []int{KindGroupMetadata, KindGroupAdmins, KindGroupMembers, KindGroupRoles, KindMemberAdded, KindMemberRemoved}

// IsChannelList reports whether kind is one of a channel's relay-signed lists
// (metadata, admins, members): stored in the channel, named by its d tag.
func IsChannelList(kind int) bool {
	return kind == KindGroupMetadata || kind == KindGroupAdmins || kind == KindGroupMembers
}

// KindsKeptFromModeration are the channel's account of who did what, which
// no 9005 hides: the relay's lists and the moderation kinds only owners,
// admins or a channel's creator can store. A member's other 9000-9009
// kinds, and the relay's workflow posts, are ordinary messages.
var KindsKeptFromModeration = []int32{
	KindPutUser, KindRemoveUser, KindEditMetadata, KindDeleteEvent, KindCreateGroup, KindDeleteGroup,
	KindGroupMetadata, KindGroupAdmins, KindGroupMembers,
}

func registerChannelHandlers(h map[int]Handler) {
	h[KindChat] = Handler{Validate: requireChannelTag, Prepare: resolveChannelForWrite, Apply: applyThreadReply}
	h[KindCreateGroup] = Handler{Validate: validateCreateGroup, Prepare: bindNewChannel, Apply: applyCreateGroup}
	h[KindJoinRequest] = Handler{Validate: requireChannelTag, Prepare: prepareJoin, Apply: applyJoin}
	h[KindLeaveRequest] = Handler{Validate: requireChannelTag, Prepare: prepareLeave, Apply: applyLeave}
	h[KindPutUser] = Handler{Validate: validatePutUser, Prepare: prepareAdminAction, Apply: applyPutUser}
	h[KindRemoveUser] = Handler{Validate: validateTargetUser, Prepare: prepareAdminAction, Apply: applyRemoveUser}
	h[KindEditMetadata] = Handler{Validate: validateEditMetadata, Prepare: prepareAdminAction, Apply: applyEditMetadata}
	h[KindDeleteEvent] = Handler{Validate: validateDeleteEvent, Prepare: prepareAdminAction, Apply: applyDeleteEvent}
	h[KindDeleteGroup] = Handler{Validate: requireChannelTag, Prepare: prepareOwnerAction, Apply: applyDeleteGroup}
	for _, kind := range RelayOnlyKinds {
		h[kind] = Handler{Validate: func(ev *nostr.Event) error {
			return Reject("restricted", "only the relay publishes kind %d", ev.Kind)
		}}
	}
}

// channelOf reads the event's h tag as a channel id.
func channelOf(ev *nostr.Event) (uuid.UUID, error) {
	tag := ev.Tags.First("h")
	if tag == nil {
		return uuid.Nil, Reject("invalid", "kind %d needs an h tag naming the channel", ev.Kind)
	}
	id, err := uuid.Parse(tag[1])
	if err != nil || tag[1] != id.String() {
		return uuid.Nil, Reject("invalid", "h tag must be a channel id (lowercase UUID)")
	}
	return id, nil
}

func requireChannelTag(ev *nostr.Event) error {
	_, err := channelOf(ev)
	return err
}

// errUnknownChannel answers alike for a channel that does not exist and one
// the actor cannot read (private, not a member): the answer must not tell
// an outsider which private channel ids exist.
func errUnknownChannel() error {
	return &Rejection{Prefix: "restricted", Reason: "channel does not exist or is private to its members", unknownChannel: true}
}

// IsUnknownChannel reports whether err is the refusal that an unknown
// channel and a private one the actor is not a member of share.
func IsUnknownChannel(err error) bool {
	var rej *Rejection
	return errors.As(err, &rej) && rej.unknownChannel
}

// channelAccess reads the channel and the actor's active role in it. An
// unknown or deleted channel, and a private one the actor is not an active
// member of, are the same rejection.
func channelAccess(ctx context.Context, w *Write, id uuid.UUID) (db.ChannelAccessRow, error) {
	read := ChannelAccess
	if w.Event != nil && nostr.IsEphemeral(w.Event.Kind) {
		// Checked on the pool, in no transaction: a lock would end with
		// the statement that took it.
		read = ChannelAccessNow
	}
	row, err := read(ctx, w.Q, db.ChannelAccessParams{CommunityID: w.Tenant.ID(), ID: id, Pubkey: w.ActorBytes()})
	if dberr.IsNotFound(err) || (err == nil && row.Visibility == db.ChannelVisibilityPrivate && row.MemberRole == nil) {
		return row, errUnknownChannel()
	}
	return row, err
}

// ChannelAccess reads a pubkey's access to a channel for a write in q's
// transaction, holding the channel's write lock (shared) until its commit:
// a change of who may read the channel (ChannelLockForChange) that committed
// first is seen, one not yet begun waits for this write's commit, and one
// waiting for the lock is not passed by this write. The lock is taken in a
// statement of its own before the read, so the read's snapshot follows
// whatever change it waited for: the role and readers version are those the
// write commits under. Outside a write transaction, use ChannelAccessNow.
func ChannelAccess(ctx context.Context, q *db.Queries, params db.ChannelAccessParams) (db.ChannelAccessRow, error) {
	if err := q.ChannelWritesLockShared(ctx, db.ChannelWritesLockSharedParams{CommunityID: params.CommunityID, ID: params.ID}); err != nil {
		return db.ChannelAccessRow{}, err
	}
	return q.ChannelAccess(ctx, params)
}

// ChannelAccessNow reads a pubkey's access to a channel without a lock: for
// a check that orders no write after it (one outside a write transaction,
// or one whose effect happens after its transaction commits).
func ChannelAccessNow(ctx context.Context, q *db.Queries, params db.ChannelAccessParams) (db.ChannelAccessRow, error) {
	return q.ChannelAccess(ctx, params)
}

// ChannelLockForChange takes the channel's locks for a change of its
// membership or metadata: the row lock (FOR NO KEY UPDATE, which serializes
// changes with each other, with a large channel's list fold and with
// workflow saves), then the write lock exclusive (waiting for the writes in
// flight and holding later ones back). Always in this order, the order of
// every path that takes both: a change waiting for a fold's row is not yet
// queued for the write lock, so the channel's messages do not wait for the
// fold. The row lock does not block the foreign-key checks of the writes
// it then waits for. No row: the channel is gone.
func ChannelLockForChange(ctx context.Context, q *db.Queries, community, channel uuid.UUID) (db.Channel, error) {
	ch, err := q.ChannelLockForChange(ctx, db.ChannelLockForChangeParams{CommunityID: community, ID: channel})
	if err != nil {
		return ch, err
	}
	return ch, q.ChannelWritesLockExclusive(ctx, db.ChannelWritesLockExclusiveParams{CommunityID: community, ID: channel})
}

// resolveChannelForWrite binds an event with an h tag to its channel: the
// channel must exist, not be archived, and a private one needs membership.
func resolveChannelForWrite(ctx context.Context, w *Write) error {
	id, err := channelOf(w.Event)
	if err != nil {
		return err
	}
	return BindChannelForWrite(ctx, w, id)
}

// BindChannelForWrite binds the event to channel id if the actor may write
// there (the rules of resolveChannelForWrite, for a channel found another
// way: a reaction's target, a deletion's, a workflow's or an approval's).
// A refusal is a *Rejection.
func BindChannelForWrite(ctx context.Context, w *Write, id uuid.UUID) error {
	access, err := channelAccess(ctx, w, id)
	if err != nil {
		return err
	}
	if access.ArchivedAt != nil {
		return Reject("restricted", "channel is archived")
	}
	w.ChannelID = &id
	w.ReadChannel(id, access)
	return nil
}

// lockChannel takes the channel's row lock for a membership or metadata
// change, binds the event to it and returns the actor's access. A private
// channel the actor is not a member of answers like an unknown one.
func lockChannel(ctx context.Context, w *Write) (db.ChannelAccessRow, error) {
	id, err := channelOf(w.Event)
	if err != nil {
		return db.ChannelAccessRow{}, err
	}
	if _, err := ChannelLockForChange(ctx, w.Q, w.Tenant.ID(), id); err != nil {
		if dberr.IsNotFound(err) {
			return db.ChannelAccessRow{}, errUnknownChannel()
		}
		return db.ChannelAccessRow{}, err
	}
	access, err := channelAccess(ctx, w, id)
	if err != nil {
		return access, err
	}
	// The version read under the lock, like any channel write's: the
	// fan-out of this event and of what it emits must not use a reader set
	// cached before a change another process committed.
	w.ChannelID = &id
	w.ReadChannel(id, access)
	// An archived channel's membership is frozen like its messages. Its
	// owners may still edit it, hide events in it and delete it.
	if access.ArchivedAt != nil && isMembershipKind(w.Event.Kind) {
		return access, Reject("restricted", "channel is archived")
	}
	return access, nil
}

// changesChannel reports whether kind takes its channel's row and write lock
// exclusive (ChannelLockForChange): the group writer commits such an event
// in a group of its own.
func changesChannel(kind int) bool {
	switch kind {
	case KindCreateGroup, KindEditMetadata, KindDeleteEvent, KindDeleteGroup:
		return true
	}
	return isMembershipKind(kind)
}

func isMembershipKind(kind int) bool {
	return kind == KindJoinRequest || kind == KindLeaveRequest || kind == KindPutUser || kind == KindRemoveUser
}

func validateCreateGroup(ev *nostr.Event) error {
	if _, err := channelOf(ev); err != nil {
		return err
	}
	if name := ev.Tags.First("name"); name == nil || name[1] == "" || len(name[1]) > 255 {
		return Reject("invalid", "kind 9007 needs a name tag of 1 to 255 bytes")
	}
	_, _, err := requestedVisibility(ev)
	return err
}

// bindNewChannel scopes a 9007 event to the channel it creates, so a private
// channel's creation (and name) is as private as the channel.
func bindNewChannel(_ context.Context, w *Write) error {
	id, err := channelOf(w.Event)
	w.ChannelID = &id
	return err
}

// requestedVisibility reads the visibility a 9007 or 9002 asks for, named
// is false when it asks for none. The NIP-29 flags are bare tags, ["private"]
// and ["public"], as the relay's own 39000 writes them; ["visibility",
// "private"|"open"] says the same. An event asking for both is refused: the
// relay must not guess which one a private channel's creator meant. The
// closed/open flags are not read: a private channel is joined only by
// invitation, an open one by anyone.
func requestedVisibility(ev *nostr.Event) (v db.ChannelVisibility, named bool, err error) {
	private, public := ev.Tags.Has("private"), ev.Tags.Has("public")
	for _, tag := range ev.Tags {
		if len(tag) == 0 || tag[0] != "visibility" {
			continue
		}
		switch {
		case len(tag) >= 2 && tag[1] == "private":
			private = true
		case len(tag) >= 2 && tag[1] == "open":
			public = true
		default:
			return "", false, Reject("invalid", "visibility must be open or private")
		}
	}
	switch {
	case private && public:
		return "", false, Reject("invalid", "conflicting visibility: the event asks for both a private and a public channel")
	case private:
		return db.ChannelVisibilityPrivate, true, nil
	case public:
		return db.ChannelVisibilityOpen, true, nil
	}
	return db.ChannelVisibilityOpen, false, nil
}

func applyCreateGroup(ctx context.Context, w *Write) error {
	id, _ := channelOf(w.Event)
	about := ""
	if tag := w.Event.Tags.First("about"); tag != nil {
		about = tag[1]
	}
	visibility, _, _ := requestedVisibility(w.Event) // open unless asked: validated
	created, err := w.Q.ChannelCreate(ctx, db.ChannelCreateParams{
		CommunityID: w.Tenant.ID(), ID: id, Name: w.Event.Tags.First("name")[1],
		Visibility: visibility, Description: about, CreatedBy: w.ActorBytes(),
	})
	if err != nil {
		return err
	}
	if created == 0 {
		// Taken: by a channel the actor may or may not see, live or
		// deleted. One answer for all, which never says a channel exists:
		// a private channel's id must not be confirmed to an outsider
		// who learned it (a former member, a leaked link); every other
		// write names it "does not exist or is private".
		return Reject("invalid", "channel id %s is not available; create the channel under a new random id", id)
	}
	// The channel's row, inserted by this transaction, is as good as
	// locked: no other transaction sees it before the commit.
	owner := db.MemberRoleOwner
	if err := w.addMember(ctx, id, w.ActorBytes(), &owner, nil); err != nil {
		return err
	}
	w.MembershipChanged()
	return w.emitDiscovery(ctx, id, KindGroupMetadata, KindGroupAdmins, KindGroupMembers)
}

// addMember adds or re-adds pubkey to channel (role nil: an active
// member keeps theirs, anyone else becomes a member), unless the channel
// is at its member limit and pubkey is not an active member. Every path
// that adds a member comes here. The caller holds the channel's row lock
// (lockChannel), which makes the count behind the limit exact across
// relay processes: two adds at the limit minus one cannot both pass.
func (w *Write) addMember(ctx context.Context, channel uuid.UUID, pubkey []byte, role *db.MemberRole, invitedBy []byte) error {
	limit := w.pipeline.maxChannelMembers
	added, err := w.Q.ChannelMemberUpsert(ctx, db.ChannelMemberUpsertParams{
		CommunityID: w.Tenant.ID(), ChannelID: channel, Pubkey: pubkey, Role: role, InvitedBy: invitedBy,
		Now: w.SQLNow(), MaxMembers: int32(limit),
	})
	if err != nil {
		return err
	}
	if added == 0 {
		return &Rejection{Prefix: "restricted", Reason: fmt.Sprintf("the channel has reached its member limit (%d)", limit), memberLimit: true}
	}
	return nil
}

// IsMemberLimit reports whether err is the refusal of an add to a channel
// at its member limit.
func IsMemberLimit(err error) bool {
	var rej *Rejection
	return errors.As(err, &rej) && rej.memberLimit
}

func prepareJoin(ctx context.Context, w *Write) error {
	// lockChannel refuses a private channel the actor is not a member of.
	_, err := lockChannel(ctx, w)
	return err
}

func applyJoin(ctx context.Context, w *Write) error {
	if err := w.addMember(ctx, *w.ChannelID, w.ActorBytes(), nil, nil); err != nil {
		return err
	}
	return w.membershipEvents(ctx, KindMemberAdded, w.Actor)
}

func prepareLeave(ctx context.Context, w *Write) error {
	access, err := lockChannel(ctx, w)
	if err != nil {
		return err
	}
	if access.MemberRole == nil {
		return Reject("invalid", "not a member of this channel")
	}
	return nil
}

func applyLeave(ctx context.Context, w *Write) error {
	if _, err := w.Q.ChannelMemberRemove(ctx, db.ChannelMemberRemoveParams{
		CommunityID: w.Tenant.ID(), ChannelID: *w.ChannelID, Pubkey: w.ActorBytes(), RemovedBy: w.ActorBytes(), Now: w.SQLNow(),
	}); err != nil {
		return err
	}
	return w.membershipEvents(ctx, KindMemberRemoved, w.Actor)
}

var assignableRoles = map[string]db.MemberRole{
	"owner": db.MemberRoleOwner, "admin": db.MemberRoleAdmin, "member": db.MemberRoleMember,
	"guest": db.MemberRoleGuest, "bot": db.MemberRoleBot,
}

// targetOf reads the p tag naming the user a moderation event acts on.
func targetOf(ev *nostr.Event) (string, error) {
	tag := ev.Tags.First("p")
	if tag == nil || !nostr.IsHex64(tag[1]) {
		return "", Reject("invalid", "kind %d needs a p tag with the user's 64-hex pubkey", ev.Kind)
	}
	return tag[1], nil
}

// validateTargetUser requires exactly one p tag: the relay acts on one
// user, and the stored event is the channel's lasting account of the act
// (no 9005 hides it), so it must not name users or roles it was not
// applied to.
func validateTargetUser(ev *nostr.Event) error {
	if _, err := channelOf(ev); err != nil {
		return err
	}
	if _, err := targetOf(ev); err != nil {
		return err
	}
	if len(ev.Tags.Values("p")) > 1 {
		return Reject("invalid", "kind %d names one user: send one event per p tag", ev.Kind)
	}
	return nil
}

func validatePutUser(ev *nostr.Event) error {
	if err := validateTargetUser(ev); err != nil {
		return err
	}
	if tag := ev.Tags.First("p"); len(tag) > 3 {
		return Reject("invalid", "kind 9000 gives one role: the p tag is [\"p\", <pubkey>, <role>]")
	}
	if tag := ev.Tags.First("p"); len(tag) > 2 {
		if _, ok := assignableRoles[tag[2]]; !ok {
			return Reject("invalid", "role must be one of owner, admin, member, guest, bot")
		}
	}
	return nil
}

// actorRole locks the channel and returns the actor's active role (nil if
// not a member).
func actorRole(ctx context.Context, w *Write) (*db.MemberRole, error) {
	access, err := lockChannel(ctx, w)
	return access.MemberRole, err
}

func prepareAdminAction(ctx context.Context, w *Write) error {
	role, err := actorRole(ctx, w)
	if err != nil {
		return err
	}
	if role == nil || (*role != db.MemberRoleOwner && *role != db.MemberRoleAdmin) {
		return Reject("restricted", "only channel owners and admins may use kind %d", w.Event.Kind)
	}
	return nil
}

func prepareOwnerAction(ctx context.Context, w *Write) error {
	role, err := actorRole(ctx, w)
	if err != nil {
		return err
	}
	if role == nil || *role != db.MemberRoleOwner {
		return Reject("restricted", "only channel owners may use kind %d", w.Event.Kind)
	}
	return nil
}

func (w *Write) actorIsOwner(ctx context.Context) (bool, error) {
	access, err := channelAccess(ctx, w, *w.ChannelID)
	return access.MemberRole != nil && *access.MemberRole == db.MemberRoleOwner, err
}

// roleOf returns target's active role in the event's channel, or nil.
func (w *Write) roleOf(ctx context.Context, target []byte) (*db.MemberRole, error) {
	row, err := ChannelAccess(ctx, w.Q, db.ChannelAccessParams{CommunityID: w.Tenant.ID(), ID: *w.ChannelID, Pubkey: target})
	return row.MemberRole, err
}

func applyPutUser(ctx context.Context, w *Write) error {
	target, _ := targetOf(w.Event)
	targetBytes, _ := hex.DecodeString(target)
	var role *db.MemberRole
	if tag := w.Event.Tags.First("p"); len(tag) > 2 {
		r := assignableRoles[tag[2]]
		role = &r
	}
	current, err := w.roleOf(ctx, targetBytes)
	if err != nil {
		return err
	}
	grantsPower := role != nil && (*role == db.MemberRoleOwner || *role == db.MemberRoleAdmin)
	changesPower := role != nil && current != nil && *current != *role &&
		(*current == db.MemberRoleOwner || *current == db.MemberRoleAdmin)
	if grantsPower || changesPower {
		owner, err := w.actorIsOwner(ctx)
		if err != nil {
			return err
		}
		if !owner {
			return Reject("restricted", "only channel owners may grant or change the owner and admin roles")
		}
	}
	// The user being added decides who may add them (agents often allow only their owner).
	if target != w.Actor {
		policy, err := w.Q.UserChannelAddPolicy(ctx, db.UserChannelAddPolicyParams{CommunityID: w.Tenant.ID(), Pubkey: targetBytes, Now: w.SQLNow()})
		if err != nil && !dberr.IsNotFound(err) {
			return err
		}
		switch policy.ChannelAddPolicy {
		case db.ChannelAddPolicyNobody:
			return Reject("blocked", "this user does not accept being added to channels")
		case db.ChannelAddPolicyOwnerOnly:
			if hex.EncodeToString(policy.AgentOwnerPubkey) != w.Actor {
				return Reject("blocked", "only this agent's owner may add it to channels")
			}
		}
	}
	if err := w.addMember(ctx, *w.ChannelID, targetBytes, role, w.ActorBytes()); err != nil {
		return err
	}
	return w.membershipEvents(ctx, KindMemberAdded, target)
}

func applyRemoveUser(ctx context.Context, w *Write) error {
	target, _ := targetOf(w.Event)
	targetBytes, _ := hex.DecodeString(target)
	role, err := w.roleOf(ctx, targetBytes)
	if err != nil {
		return err
	}
	if role == nil {
		return Reject("invalid", "that user is not a member of this channel")
	}
	if *role == db.MemberRoleOwner || *role == db.MemberRoleAdmin {
		owner, err := w.actorIsOwner(ctx)
		if err != nil {
			return err
		}
		if !owner {
			return Reject("restricted", "only channel owners may remove an %s", *role)
		}
	}
	if _, err := w.Q.ChannelMemberRemove(ctx, db.ChannelMemberRemoveParams{
		CommunityID: w.Tenant.ID(), ChannelID: *w.ChannelID, Pubkey: targetBytes, RemovedBy: w.ActorBytes(), Now: w.SQLNow(),
	}); err != nil {
		return err
	}
	return w.membershipEvents(ctx, KindMemberRemoved, target)
}

func validateEditMetadata(ev *nostr.Event) error {
	if _, err := channelOf(ev); err != nil {
		return err
	}
	if name := ev.Tags.First("name"); name != nil && (name[1] == "" || len(name[1]) > 255) {
		return Reject("invalid", "name must be 1 to 255 bytes")
	}
	_, _, err := requestedVisibility(ev)
	return err
}

func applyEditMetadata(ctx context.Context, w *Write) error {
	params := db.ChannelUpdateMetadataParams{CommunityID: w.Tenant.ID(), ID: *w.ChannelID, Now: w.SQLNow()}
	if tag := w.Event.Tags.First("name"); tag != nil {
		params.Name = &tag[1]
	}
	if tag := w.Event.Tags.First("about"); tag != nil {
		params.Description = &tag[1]
	}
	if v, named, _ := requestedVisibility(w.Event); named { // validated
		access, err := channelAccess(ctx, w, *w.ChannelID)
		if err != nil {
			return err
		}
		// Opening a private channel publishes its whole history; like granting
		// the admin role, that is the owner's call. Restating the current
		// visibility, as clients sending full metadata do, changes nothing.
		if v != access.Visibility {
			if access.MemberRole == nil || *access.MemberRole != db.MemberRoleOwner {
				return Reject("restricted", "only channel owners may change a channel between private and open")
			}
			params.Visibility = &v
			w.MembershipChanged() // who may read changes with visibility
		}
	}
	if err := w.Q.ChannelUpdateMetadata(ctx, params); err != nil {
		return err
	}
	return w.emitDiscovery(ctx, *w.ChannelID, KindGroupMetadata)
}

func validateDeleteEvent(ev *nostr.Event) error {
	if _, err := channelOf(ev); err != nil {
		return err
	}
	for _, v := range ev.Tags.Values("e") {
		if nostr.IsHex64(v) {
			return nil
		}
	}
	return Reject("invalid", "kind 9005 needs e tags naming the events to delete")
}

// applyDeleteEvent hides the named events of the channel, except
// KindsKeptFromModeration: an admin must not erase an owner's acts or the
// relay's account of membership. A request naming one is refused whole.
func applyDeleteEvent(ctx context.Context, w *Write) error {
	ids := DeletionTargetIDs(w.Event)
	kept, err := w.Q.EventsInChannelKeptFromModeration(ctx, db.EventsInChannelKeptFromModerationParams{
		CommunityID: w.Tenant.ID(), ChannelID: *w.ChannelID, Ids: ids, KeptKinds: KindsKeptFromModeration,
	})
	if err != nil {
		return err
	}
	if kept {
		return Reject("restricted", "kind 9005 cannot hide the channel's lists (39000-39002) or moderation events (9000-9002, 9005, 9007, 9008)")
	}
	_, err = w.Q.EventsDeleteInChannel(ctx, db.EventsDeleteInChannelParams{
		CommunityID: w.Tenant.ID(), ChannelID: *w.ChannelID, Ids: ids, KeptKinds: KindsKeptFromModeration, Now: w.SQLNow(),
	})
	return err
}

func applyDeleteGroup(ctx context.Context, w *Write) error {
	w.MembershipChanged()
	return w.Q.ChannelSoftDelete(ctx, db.ChannelSoftDeleteParams{CommunityID: w.Tenant.ID(), ID: *w.ChannelID, Now: w.SQLNow()})
}

// membershipEvents writes what a membership change publishes: the admins
// and members lists, and a notification to the user concerned. A channel of
// at least foldMembers members has its lists marked due instead (see
// FoldChannelLists): rewriting them whole costs in proportion to its
// members, on every change.
func (w *Write) membershipEvents(ctx context.Context, notification int, member string) error {
	w.MembershipChanged()
	large, err := w.Q.ChannelMembersAtLeast(ctx, db.ChannelMembersAtLeastParams{
		CommunityID: w.Tenant.ID(), ChannelID: *w.ChannelID, N: int32(w.pipeline.foldMembers),
	})
	if err != nil {
		return err
	}
	if large {
		err = w.Q.ChannelListsMarkDue(ctx, db.ChannelListsMarkDueParams{
			CommunityID: w.Tenant.ID(), ChannelID: *w.ChannelID, Now: w.SQLNow(), AfterSeconds: w.pipeline.foldInterval.Seconds(),
		})
	} else {
		err = w.emitDiscovery(ctx, *w.ChannelID, KindGroupAdmins, KindGroupMembers)
	}
	if err != nil {
		return err
	}
	return w.emitMemberNotice(ctx, notification, member)
}

// emitMemberNotice writes the added or removed notice about member, dated
// strictly after that member's previous one (ChannelMemberNoticeDate): by
// the clock alone, a join, leave and join within one second made the last
// notice a duplicate of the first, and the member's notices ended in
// "removed" while they were active. The caller holds the channel's row lock.
func (w *Write) emitMemberNotice(ctx context.Context, notification int, member string) error {
	key, err := w.pipeline.relayKey(ctx, w.Tenant.ID())
	if err != nil {
		return err
	}
	memberBytes, err := hex.DecodeString(member)
	if err != nil {
		return err
	}
	now := w.pipeline.clock.Now()
	createdAt, err := w.Q.ChannelMemberNoticeDate(ctx, db.ChannelMemberNoticeDateParams{
		CommunityID: w.Tenant.ID(), ChannelID: *w.ChannelID, Pubkey: memberBytes,
		Now: now.Unix(), Latest: now.Add(w.pipeline.maxFutureSkew).Unix(),
	})
	if err != nil {
		return err
	}
	ev := &nostr.Event{Kind: notification, Content: "", Tags: nostr.Tags{{"p", member}, {"h", w.ChannelID.String()}}, CreatedAt: createdAt}
	if err := ev.Sign(key); err != nil {
		return err
	}
	return w.storeEmitted(ctx, ev, nil)
}

// emitDiscovery writes the channel's relay-signed discovery events
// (NIP-29 39000 metadata, 39001 admins, 39002 members), scoped to the channel.
func (w *Write) emitDiscovery(ctx context.Context, channel uuid.UUID, kinds ...int) error {
	ch, err := ChannelLockForChange(ctx, w.Q, w.Tenant.ID(), channel)
	if err != nil {
		return err
	}
	return w.emitDiscoveryOf(ctx, ch, kinds...)
}

// emitLists writes the channel's admins and members lists; the caller holds
// the channel's row lock.
func (w *Write) emitLists(ctx context.Context, channel uuid.UUID) error {
	return w.emitDiscoveryOf(ctx, db.Channel{CommunityID: w.Tenant.ID(), ID: channel}, KindGroupAdmins, KindGroupMembers)
}

// emitDiscoveryOf writes the discovery events of kinds for ch, read under
// its row lock (a metadata event needs its columns, the lists only its id).
func (w *Write) emitDiscoveryOf(ctx context.Context, ch db.Channel, kinds ...int) error {
	channel := ch.ID
	var members []db.ChannelMembersActiveRow
	var err error
	for _, kind := range kinds {
		tags := nostr.Tags{{"d", channel.String()}}
		switch kind {
		case KindGroupMetadata:
			tags = append(tags, nostr.Tag{"name", ch.Name}, nostr.Tag{"about", ch.Description})
			if ch.Visibility == db.ChannelVisibilityPrivate {
				tags = append(tags, nostr.Tag{"private"}, nostr.Tag{"closed"})
			} else {
				tags = append(tags, nostr.Tag{"public"}, nostr.Tag{"open"})
			}
		case KindGroupAdmins, KindGroupMembers:
			if members == nil {
				if members, err = w.Q.ChannelMembersActive(ctx, db.ChannelMembersActiveParams{CommunityID: w.Tenant.ID(), ChannelID: channel}); err != nil {
					return err
				}
			}
			for _, m := range members {
				if kind == KindGroupMembers {
					tags = append(tags, nostr.Tag{"p", hex.EncodeToString(m.Pubkey)})
				} else if m.Role == db.MemberRoleOwner || m.Role == db.MemberRoleAdmin {
					tags = append(tags, nostr.Tag{"p", hex.EncodeToString(m.Pubkey), string(m.Role)})
				}
			}
		}
		if err := w.Emit(ctx, kind, "", tags, &channel); err != nil {
			return err
		}
	}
	return nil
}

// Emit signs an event with the community's relay key, stores it in this
// transaction and fans it out after commit. It writes no side rows: see
// EmitWaking for the events meant to wake the pubkeys they p-tag.
func (w *Write) Emit(ctx context.Context, kind int, content string, tags nostr.Tags, channel *uuid.UUID) error {
	ev, err := w.relaySign(ctx, kind, content, tags)
	if err != nil {
		return err
	}
	return w.storeEmitted(ctx, ev, channel)
}

// relaySign builds and signs a relay-signed event dated by the pipeline's
// clock. For a replaceable or addressable kind it first takes the slot's
// lock and clears the slot, and dates the event strictly after the version
// it replaces (EventSlotClear), at most the future limit ahead.
func (w *Write) relaySign(ctx context.Context, kind int, content string, tags nostr.Tags) (*nostr.Event, error) {
	key, err := w.pipeline.relayKey(ctx, w.Tenant.ID())
	if err != nil {
		return nil, err
	}
	pub := key.PublicKey()
	now := w.pipeline.clock.Now()
	ev := &nostr.Event{Kind: kind, Content: content, Tags: tags, CreatedAt: now.Unix()}
	if nostr.IsAddressable(kind) || nostr.IsReplaceable(kind) {
		var d *string
		if nostr.IsAddressable(kind) {
			tag := ev.DTag()
			d = &tag
		}
		if err := w.Q.EventSlotLock(ctx, db.EventSlotLockParams{
			CommunityID: w.Tenant.ID(), Pubkey: pub[:], Kind: int32(kind), DTag: d,
		}); err != nil {
			return nil, err
		}
		if ev.CreatedAt, err = w.Q.EventSlotClear(ctx, db.EventSlotClearParams{
			CommunityID: w.Tenant.ID(), Pubkey: pub[:], Kind: int32(kind), DTag: d,
			Now: now.Unix(), Latest: now.Add(w.pipeline.maxFutureSkew).Unix(),
		}); err != nil {
			return nil, err
		}
	}
	if err := ev.Sign(key); err != nil {
		return nil, err
	}
	return ev, nil
}

// storeEmitted inserts a relay-signed event in this transaction and keeps
// it for the fan-out after commit.
func (w *Write) storeEmitted(ctx context.Context, ev *nostr.Event, channel *uuid.UUID) error {
	if err := w.readChannelOnce(ctx, channel); err != nil {
		return err
	}
	params, err := eventstore.InsertParams(w.Tenant.ID(), ev, channel)
	if err != nil {
		return err
	}
	if _, err := w.Q.EventInsert(ctx, params); err != nil {
		return fmt.Errorf("store relay-signed kind %d: %w", ev.Kind, err)
	}
	w.emitted = append(w.emitted, emittedEvent{ev: ev, channel: channel})
	return nil
}
