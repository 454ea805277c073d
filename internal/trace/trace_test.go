package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/nbd-wtf/go-nostr"
	"github.com/stretchr/testify/require"
)

var (
	communityA = uuid.MustParse("11111111-1111-4111-8111-111111111111")
	communityB = uuid.MustParse("22222222-2222-4222-8222-222222222222")
	channelX   = uuid.MustParse("aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa")
	channelY   = uuid.MustParse("bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb")
)

const (
	testPubkey  = "52A228D6EDF316EC6812AC3C9FC0D696AB59FC7954D77E7BE31EEDCDDF91335B"
	testEventID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func testState() AbstractState {
	return StateForRequest(communityA, "relay.example", testPubkey)
}

func ptr[T any](v T) *T { return &v }

func TestStateForRequest(t *testing.T) {
	t.Parallel()
	require.Equal(t, AbstractState{
		ResolvedCommunity: "11111111-1111-4111-8111-111111111111",
		BoundHost:         "relay.example",
		Actor:             "52a228d6edf316ec",
	}, testState())
	require.Equal(t, OpaqueID("0123456789abcdef"), OpaqueIDFor(testEventID))
	require.Equal(t, ActorLabel("abc"), ActorLabelFor("abc"))
}

func TestCountingTracerDelegatesEnabledToInner(t *testing.T) {
	t.Parallel()

	overNoop := NewCountingTracer(NoopTracer{})
	require.False(t, overNoop.Enabled(), "over NoopTracer the counting tracer must not enable trace-only reads")

	mem := &MemoryTracer{}
	overLive := NewCountingTracer(mem)
	require.True(t, overLive.Enabled(), "over a live tracer the counting tracer must not suppress emits")

	var buf bytes.Buffer
	require.True(t, NewCountingTracer(NewJSONLTracer(&buf)).Enabled())
	require.False(t, NewCountingTracer(nil).Enabled())

	step := NewStep(ImplBug{Kind: "probe"}, testState())
	overNoop.Record(step)
	overLive.Record(step)
	overLive.Record(step)
	require.Equal(t, uint64(1), overNoop.Count(), "Record counts even when the inner tracer is disabled")
	require.Equal(t, uint64(2), overLive.Count())
	require.Equal(t, []TraceStep{step, step}, mem.Steps(), "Record forwards every step")
}

func TestEmitGuardDropIsSilentWhenAnEmitReachedTheTracer(t *testing.T) {
	t.Parallel()
	mem := &MemoryTracer{}
	st := testState()
	guard, tracer := Arm(mem, st, KindIngestExitedWithoutTrace)
	RecordReqAuthCheck(tracer, st, channelX, true)
	guard.Close()
	guard.Close()

	steps := mem.Steps()
	require.Len(t, steps, 1)
	require.Equal(t, ActionAuthCheck, steps[0].Action.ActionType())
}

func TestEmitGuardDropRecordsExactlyOneImplBugWhenNoEmit(t *testing.T) {
	t.Parallel()
	mem := &MemoryTracer{}
	st := testState()
	guard, tracer := Arm(mem, st, KindIngestExitedWithoutTrace)
	require.True(t, tracer.Enabled())
	guard.Close()
	guard.Close()

	require.Equal(t, []TraceStep{{
		SchemaVersion: SchemaVersion,
		Action:        ImplBug{Kind: KindIngestExitedWithoutTrace},
		StateAfter:    st,
	}}, mem.Steps())
}

func TestEmitGuardConcurrentCloseRecordsOnce(t *testing.T) {
	t.Parallel()
	mem := &MemoryTracer{}
	guard, _ := Arm(mem, testState(), KindIngestExitedWithoutTrace)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(guard.Close)
	}
	wg.Wait()
	require.Len(t, mem.Steps(), 1)
}

func TestRecordReqAuthCheckAllowWhenMember(t *testing.T) {
	t.Parallel()
	mem := &MemoryTracer{}
	RecordReqAuthCheck(mem, testState(), channelX, true)
	require.Equal(t, []TraceStep{NewStep(AuthCheck{
		Channel:          ChannelLabelFor(channelX),
		ClaimedCommunity: nil,
		Verdict:          VerdictAllow,
	}, testState())}, mem.Steps())
}

func TestRecordReqAuthCheckDenyWhenNotMember(t *testing.T) {
	t.Parallel()
	mem := &MemoryTracer{}
	RecordReqAuthCheck(mem, testState(), channelX, false)
	steps := mem.Steps()
	require.Len(t, steps, 1)
	check, ok := steps[0].Action.(AuthCheck)
	require.True(t, ok)
	require.Equal(t, VerdictDeny, check.Verdict)
	require.Nil(t, check.ClaimedCommunity)
	require.Equal(t, ChannelLabelFor(channelX), check.Channel)
}

func TestProjectRowCommunities_ChannelLessUsesResolved(t *testing.T) {
	t.Parallel()
	labels, err := ProjectRowCommunities([]*uuid.UUID{nil, nil}, communityA, nil)
	require.NoError(t, err)
	require.Equal(t, []CommunityLabel{CommunityLabelFor(communityA), CommunityLabelFor(communityA)}, labels)
}

func TestProjectRowCommunities_ChannelScopedUsesLookup(t *testing.T) {
	t.Parallel()
	// channelY truly belongs to communityB even though the request resolved to
	// communityA: the projection must report the row's true owner.
	lookup := map[uuid.UUID]uuid.UUID{channelX: communityA, channelY: communityB}
	labels, err := ProjectRowCommunities([]*uuid.UUID{&channelX, nil, &channelY}, communityA, lookup)
	require.NoError(t, err)
	require.Equal(t, []CommunityLabel{
		CommunityLabelFor(communityA),
		CommunityLabelFor(communityA),
		CommunityLabelFor(communityB),
	}, labels)
}

func TestProjectRowCommunities_ChannelScopedMissingIsBreach(t *testing.T) {
	t.Parallel()
	lookup := map[uuid.UUID]uuid.UUID{channelX: communityA}
	labels, err := ProjectRowCommunities([]*uuid.UUID{&channelX, &channelY}, communityA, lookup)
	require.Nil(t, labels, "the resolved community must never be substituted")
	var missing *MissingLookup
	require.True(t, errors.As(err, &missing))
	require.Equal(t, channelY, missing.Channel)
	require.Equal(t, KindRowCommunityLookupMissing, missing.Kind())
}

func TestRecordReadMessageRowsMissingLookupEmitsImplBug(t *testing.T) {
	t.Parallel()
	mem := &MemoryTracer{}
	RecordReadMessageRows(mem, testState(), &channelY, []*uuid.UUID{&channelY}, communityA, map[uuid.UUID]uuid.UUID{})
	require.Equal(t, []TraceStep{NewStep(ImplBug{Kind: KindRowCommunityLookupMissing}, testState())}, mem.Steps())
}

func TestRecordReadMessageRowsEmitsReadMessageRows(t *testing.T) {
	t.Parallel()
	mem := &MemoryTracer{}
	lookup := map[uuid.UUID]uuid.UUID{channelX: communityA}
	RecordReadMessageRows(mem, testState(), &channelX, []*uuid.UUID{&channelX}, communityA, lookup)
	require.Equal(t, []TraceStep{NewStep(ReadMessageRows{
		Channel:        ptr(ChannelLabelFor(channelX)),
		RowCommunities: []CommunityLabel{CommunityLabelFor(communityA)},
	}, testState())}, mem.Steps())
}

func TestRecordReadByIDRowsEmitsReadByIDRows(t *testing.T) {
	t.Parallel()
	mem := &MemoryTracer{}
	lookup := map[uuid.UUID]uuid.UUID{channelY: communityB}
	RecordReadByIDRows(mem, testState(), []*uuid.UUID{nil, &channelY}, communityA, lookup)
	require.Equal(t, []TraceStep{NewStep(ReadByIDRows{
		Channel:        nil,
		RowCommunities: []CommunityLabel{CommunityLabelFor(communityA), CommunityLabelFor(communityB)},
	}, testState())}, mem.Steps())

	missing := &MemoryTracer{}
	RecordReadByIDRows(missing, testState(), []*uuid.UUID{&channelX}, communityA, lookup)
	require.Equal(t, []TraceStep{NewStep(ImplBug{Kind: KindRowCommunityLookupMissing}, testState())}, missing.Steps())
}

const goldenState = `"state_after":{"resolved_community":"11111111-1111-4111-8111-111111111111","bound_host":"relay.example","actor":"52a228d6edf316ec"}`

func TestJSONWriteInsertShape(t *testing.T) {
	t.Parallel()
	withClaim := NewStep(WriteInsert{
		MsgID:            OpaqueIDFor(testEventID),
		Channel:          ChannelLabelFor(channelX),
		ClaimedCommunity: ptr(CommunityLabelFor(communityB)),
	}, testState())
	got, err := json.Marshal(withClaim)
	require.NoError(t, err)
	require.JSONEq(t, `{"schema_version":1,"action":{"type":"write_insert","msg_id":"0123456789abcdef","channel":"aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa","claimed_community":"22222222-2222-4222-8222-222222222222"},`+goldenState+`}`, string(got))

	got, err = json.Marshal(WriteInsert{MsgID: OpaqueIDFor(testEventID), Channel: ChannelLabelFor(channelX)})
	require.NoError(t, err)
	require.Equal(t, `{"type":"write_insert","msg_id":"0123456789abcdef","channel":"aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"}`, string(got),
		"claimed_community is omitted when absent and type comes first")
}

func TestJSONAuthCheckShape(t *testing.T) {
	t.Parallel()
	got, err := json.Marshal(NewStep(AuthCheck{Channel: ChannelLabelFor(channelX), Verdict: VerdictDeny}, testState()))
	require.NoError(t, err)
	require.Equal(t, `{"schema_version":1,"action":{"type":"auth_check","channel":"aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa","verdict":"deny"},`+goldenState+`}`, string(got))
}

func TestJSONImplBugShape(t *testing.T) {
	t.Parallel()
	got, err := json.Marshal(NewStep(ImplBug{Kind: KindIngestExitedWithoutTrace}, testState()))
	require.NoError(t, err)
	require.Equal(t, `{"schema_version":1,"action":{"type":"impl_bug","kind":"ingest_exited_without_trace"},`+goldenState+`}`, string(got))
}

func TestJSONOtherActionShapes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		action TraceAction
		want   string
	}{
		{WriteInsertGlobal{MsgID: "0123456789abcdef"}, `{"type":"write_insert_global","msg_id":"0123456789abcdef"}`},
		{WriteDuplicate{MsgID: "0123456789abcdef", Channel: ChannelLabelFor(channelY)}, `{"type":"write_duplicate","msg_id":"0123456789abcdef","channel":"bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"}`},
		{SanitizedError{Reason: ReasonServerError}, `{"type":"sanitized_error","reason":"server_error"}`},
		{ReadMessageRows{}, `{"type":"read_message_rows","row_communities":[]}`},
		{ReadMessageRows{Channel: ptr(ChannelLabelFor(channelX)), RowCommunities: []CommunityLabel{CommunityLabelFor(communityA)}}, `{"type":"read_message_rows","channel":"aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa","row_communities":["11111111-1111-4111-8111-111111111111"]}`},
		{ReadByIDRows{}, `{"type":"read_by_id_rows","row_communities":[]}`},
		{ReadHostFeedRows{RowCommunities: []CommunityLabel{CommunityLabelFor(communityB)}}, `{"type":"read_host_feed_rows","row_communities":["22222222-2222-4222-8222-222222222222"]}`},
	}
	for _, tc := range cases {
		got, err := json.Marshal(tc.action)
		require.NoError(t, err)
		require.Equal(t, tc.want, string(got))
	}
}

func TestJSONLTracerRoundTrip(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tracer := NewJSONLTracer(&buf)
	require.True(t, tracer.Enabled())
	steps := []TraceStep{
		NewStep(WriteInsert{MsgID: "0123456789abcdef", Channel: ChannelLabelFor(channelX), ClaimedCommunity: ptr(CommunityLabelFor(communityA))}, testState()),
		NewStep(WriteInsertGlobal{MsgID: "0123456789abcdef"}, testState()),
		NewStep(WriteDuplicate{MsgID: "0123456789abcdef", Channel: ChannelLabelFor(channelX)}, testState()),
		NewStep(SanitizedError{Reason: ReasonRestricted}, testState()),
		NewStep(AuthCheck{Channel: ChannelLabelFor(channelY), Verdict: VerdictAllow}, testState()),
		NewStep(ReadMessageRows{RowCommunities: []CommunityLabel{}}, testState()),
		NewStep(ReadByIDRows{RowCommunities: []CommunityLabel{CommunityLabelFor(communityB)}}, testState()),
		NewStep(ReadHostFeedRows{RowCommunities: []CommunityLabel{}}, testState()),
		NewStep(ImplBug{Kind: KindRowCommunityLookupMissing}, testState()),
	}
	for _, s := range steps {
		tracer.Record(s)
	}
	require.NoError(t, tracer.Err())

	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, len(steps))
	for i, line := range lines {
		var got TraceStep
		require.NoError(t, json.Unmarshal([]byte(line), &got))
		require.Equal(t, steps[i], got)
	}

	_, err := UnmarshalAction([]byte(`{"type":"nope"}`))
	require.Error(t, err)
	_, err = UnmarshalAction([]byte(`{"kind":"x"}`))
	require.Error(t, err)
}

func TestJSONLTracerConcurrentRecordWritesWholeLines(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tracer := NewJSONLTracer(&buf)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 50 {
				tracer.Record(NewStep(ImplBug{Kind: "k"}, testState()))
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, 16*50)
	for _, line := range lines {
		require.True(t, json.Valid([]byte(line)))
	}
}

func TestNoopTracerIsDisabled(t *testing.T) {
	t.Parallel()
	var tr Tracer = NoopTracer{}
	tr.Record(NewStep(ImplBug{Kind: "k"}, testState()))
	require.False(t, tr.Enabled())
	st := testState()
	require.False(t, Active(tr, &st))
	require.False(t, Active(&MemoryTracer{}, nil))
	require.True(t, Active(&MemoryTracer{}, &st))
}

func TestClaimedCommunityFromEvent(t *testing.T) {
	t.Parallel()
	a := CommunityLabelFor(communityA)
	cases := []struct {
		name string
		tags [][]string
		want *CommunityLabel
	}{
		{"no tags", nil, nil},
		{"no h tag", [][]string{{"e", communityA.String()}, {"p", "x"}}, nil},
		{"first h tag", [][]string{{"e", "x"}, {"h", communityA.String()}, {"h", communityB.String()}}, &a},
		{"first h tag not a uuid", [][]string{{"h", "general"}, {"h", communityB.String()}}, nil},
		{"h tag without value", [][]string{{"h"}, {"h", communityB.String()}}, nil},
		{"empty tag skipped", [][]string{{}, {"h", communityA.String()}}, &a},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, ClaimedCommunityFromEvent(tc.tags), tc.name)
	}
	require.Equal(t, &a, ClaimedCommunityFromEvent(nostr.Tags{{"h", communityA.String()}}), "accepts nostr.Tags")
}

func TestSanitizedReasonFor(t *testing.T) {
	t.Parallel()
	cases := map[string]SanitizedReason{
		"invalid":                  ReasonInvalid,
		"invalid: bad signature":   ReasonInvalid,
		"restricted":               ReasonRestricted,
		"auth-required":            ReasonRestricted,
		"auth-required: login":     ReasonRestricted,
		"blocked":                  ReasonRestricted,
		"error":                    ReasonServerError,
		"rate-limited":             ReasonServerError,
		"duplicate":                ReasonServerError,
		"pow":                      ReasonServerError,
		"":                         ReasonServerError,
		"INVALID":                  ReasonServerError,
		"something else: whatever": ReasonServerError,
	}
	for prefix, want := range cases {
		require.Equal(t, want, SanitizedReasonFor(prefix), prefix)
	}
}
