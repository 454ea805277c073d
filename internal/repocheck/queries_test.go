package repocheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// queryFiles names, for every query file, the one table its statements are
// about and the noun every query name starts with (the table's entity,
// singular; a plural form is fine: ChannelsReadable). A reader looking for
// the statements of a table opens one file and finds them all there, named
// alike. A new query file must be added here.
var queryFiles = map[string]struct{ table, noun string }{
	"channels.sql":                               {"channels", "Channel"},
	"channel_members.sql":                        {"channel_members", "ChannelMember"},
	"channel_lists_due.sql":                      {"channel_lists_due", "ChannelLists"},
	"communities.sql":                            {"communities", "Community"},
	"events.sql":                                 {"events", "Event"},
	"event_mentions.sql":                         {"event_mentions", "EventMention"},
	"http_auth_replays.sql":                      {"http_auth_replays", "HTTPAuthReplay"},
	"listener_registrations.sql":                 {"operator_listener_pubkeys", "ListenerRegistration"},
	"media_blob_sweep.sql":                       {"media_blob_sweep", "MediaBlobSweep"},
	"media_unreferenced_blobs.sql":               {"media_unreferenced_blobs", "MediaUnreferencedBlobs"},
	"media_usage.sql":                            {"media_usage", "MediaUsage"},
	"operator_auth_replays.sql":                  {"operator_auth_replays", "OperatorAuthReplay"},
	"outbox.sql":                                 {"operator_listener_outbox", "Outbox"},
	"outbox_claim.gen.sql":                       {"operator_listener_outbox", "Outbox"},
	"reactions.sql":                              {"reactions", "Reaction"},
	"replica_heartbeat.sql":                      {"replica_heartbeat", "ReplicaHeartbeat"},
	"threads.sql":                                {"thread_metadata", "Thread"},
	"users.sql":                                  {"users", "User"},
	"workflows.sql":                              {"workflows", "Workflow"},
	"scheduled_workflow_fires.sql":               {"scheduled_workflow_fires", "ScheduledWorkflowFire"},
	"workflow_approvals.sql":                     {"workflow_approvals", "WorkflowApproval"},
	"workflow_runs.sql":                          {"workflow_runs", "WorkflowRun"},
	"workflow_run_claim.gen.sql":                 {"workflow_runs", "WorkflowRun"},
	"community_deletion_requests.sql":            {"community_deletion_requests", "DeletionRequest"},
	"community_deletion_approvals.sql":           {"community_deletion_approvals", "DeletionApproval"},
	"community_deletion_checkpoints.sql":         {"community_deletion_checkpoints", "DeletionCheckpoint"},
	"community_deletion_manifest_keys.sql":       {"community_deletion_manifest_keys", "DeletionManifest"},
	"community_deletion_executor_heartbeats.sql": {"community_deletion_executor_heartbeats", "DeletionExecutor"},
	"community_serving_write_leases.sql":         {"community_serving_write_leases", "ServingLease"},
	"storage_taxonomy_sweeps.sql":                {"storage_taxonomy_sweeps", "StorageTaxonomySweep"},
}

var (
	queryName   = regexp.MustCompile(`(?m)^-- name: (\w+) `)
	lockClauses = regexp.MustCompile(`(?i)\b(DO|FOR)\s+UPDATE\b`)
	writeTarget = regexp.MustCompile(`(?i)\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+([a-z_]+)`)
)

// One table per query file, one naming pattern: every statement of a file
// touches the file's table and writes no other, and its name starts with
// the file's noun.
func TestQueryFilesHoldOneTableEachNamedNounFirst(t *testing.T) {
	t.Parallel()
	paths, err := filepath.Glob("../../queries/*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	var problems []string
	for _, path := range paths {
		file := filepath.Base(path)
		want, ok := queryFiles[file]
		if !ok {
			problems = append(problems, file+": not listed in queryFiles (which table is it about?)")
			continue
		}
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		mentions := regexp.MustCompile(`\b` + want.table + `\b|\b` + want.table + `_\w*\(`)
		names := queryName.FindAllStringSubmatchIndex(string(raw), -1)
		require.NotEmpty(t, names, file)
		for i, m := range names {
			name := string(raw[m[2]:m[3]])
			end := len(raw)
			if i+1 < len(names) {
				end = names[i+1][0]
			}
			sql := stripComments(string(raw[m[1]:end]))
			if !strings.HasPrefix(name, want.noun) {
				problems = append(problems, file+": "+name+" does not start with "+want.noun)
			}
			if !mentions.MatchString(sql) {
				problems = append(problems, file+": "+name+" does not touch "+want.table)
			}
			for _, w := range writeTarget.FindAllStringSubmatch(lockClauses.ReplaceAllString(sql, ""), -1) {
				if w[1] != want.table {
					problems = append(problems, file+": "+name+" writes "+w[1]+", not "+want.table)
				}
			}
		}
	}
	if len(problems) > 0 {
		t.Fatalf("query files must hold one table each, names noun first:\n%s", strings.Join(problems, "\n"))
	}
}

func stripComments(sql string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(sql, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
