// Package deletion deletes a whole community: every row of the
// community-scoped PostgreSQL catalog, the community's object-store
// bindings (sidecars, upload records, and shared blobs no other community
// references), and its Redis keys, leaving the communities row as a
// permanent tombstone that keeps the host reserved.
//
// The safety rules live in SQL (the community_deletion migration): the
// write fence on every community-scoped table, the stage machine,
// approvals bound to an exact inventory digest, executor leases with
// generations. This package runs
// the stages an operator starts with `buzz-admin deletions run|drain`.
package deletion

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// Stages of a deletion request, in order. Each moves one step forward.
const (
	StageSubmitted         = "submitted"
	StageInventoried       = "inventoried"
	StageApproved          = "approved"
	StageFenced            = "fenced"
	StageDrained           = "drained"
	StageBindingsRemoved   = "bindings_removed"
	StagePostgresPurged    = "postgres_purged"
	StageCachePurged       = "cache_purged"
	StageLogicallyVerified = "logically_verified"
	StageRetentionPending  = "retention_pending"
)

// Stages lists every stage in order.
var Stages = []string{StageSubmitted, StageInventoried, StageApproved, StageFenced, StageDrained,
	StageBindingsRemoved, StagePostgresPurged, StageCachePurged, StageLogicallyVerified, StageRetentionPending}

// Runnable reports whether the executor works on a request at stage.
func Runnable(stage string) bool {
	switch stage {
	case StageApproved, StageFenced, StageDrained, StageBindingsRemoved, StagePostgresPurged, StageCachePurged, StageLogicallyVerified:
		return true
	}
	return false
}

// RedisPattern matches every Redis key of the community.
func RedisPattern(community uuid.UUID) string { return "buzz:" + community.String() + ":*" }

// Config holds the deletion settings; every one has a default.
type Config struct {
	// ManifestChunkKeys (BUZZ_DELETION_MANIFEST_CHUNK_KEYS) bounds the keys
	// of one manifest chunk, the unit of object deletion and checkpoint.
	ManifestChunkKeys int
	// PurgeBatchRows (BUZZ_DELETION_PURGE_BATCH_ROWS) bounds the rows one
	// purge transaction deletes.
	PurgeBatchRows int
	// Lease (BUZZ_DELETION_LEASE_SECS) is how long a claim lives without a
	// heartbeat; a dead executor's request is taken over after it.
	Lease time.Duration
	// RetryBaseDelay (BUZZ_DELETION_RETRY_BASE_SECS) is the wait after the
	// first transient failure; each consecutive failure doubles it.
	RetryBaseDelay time.Duration
	// MaxFailureStreak (BUZZ_DELETION_MAX_FAILURES) consecutive transient
	// failures at one stage block the request.
	MaxFailureStreak int
	// SweepMaxObjects (BUZZ_DELETION_SWEEP_MAX_OBJECTS) bounds a whole-bucket
	// sweep.
	SweepMaxObjects int64
	// PauseBeforeStampFile (BUZZ_DELETION_TEST_PAUSE_BEFORE_STAMP), for
	// crash tests only: after deleting a chunk's objects and before
	// stamping the chunk, create this file and wait forever.
	PauseBeforeStampFile string
}

// DefaultConfig is the production configuration.
func DefaultConfig() Config {
	return Config{
		ManifestChunkKeys: 10000,
		PurgeBatchRows:    5000,
		Lease:             60 * time.Second,
		RetryBaseDelay:    30 * time.Second,
		MaxFailureStreak:  8,
		SweepMaxObjects:   10_000_000,
	}
}

// MaxManifestChunkKeys caps BUZZ_DELETION_MANIFEST_CHUNK_KEYS: a chunk is
// one row and one bulk delete.
const MaxManifestChunkKeys = 100000

// ConfigFromEnv reads the settings; a malformed value is an error naming it.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	var errs []error
	positive := func(name string, max int64, set func(int64)) {
		v := getenv(name)
		if v == "" {
			return
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n > max {
			errs = append(errs, fmt.Errorf("%s=%q: want a whole number from 1 to %d", name, v, max))
			return
		}
		set(n)
	}
	positive("BUZZ_DELETION_MANIFEST_CHUNK_KEYS", MaxManifestChunkKeys, func(n int64) { c.ManifestChunkKeys = int(n) })
	positive("BUZZ_DELETION_PURGE_BATCH_ROWS", 1_000_000, func(n int64) { c.PurgeBatchRows = int(n) })
	positive("BUZZ_DELETION_LEASE_SECS", 3600, func(n int64) { c.Lease = time.Duration(n) * time.Second })
	positive("BUZZ_DELETION_RETRY_BASE_SECS", 3600, func(n int64) { c.RetryBaseDelay = time.Duration(n) * time.Second })
	positive("BUZZ_DELETION_MAX_FAILURES", 1000, func(n int64) { c.MaxFailureStreak = int(n) })
	positive("BUZZ_DELETION_SWEEP_MAX_OBJECTS", 1<<40, func(n int64) { c.SweepMaxObjects = n })
	c.PauseBeforeStampFile = getenv("BUZZ_DELETION_TEST_PAUSE_BEFORE_STAMP")
	return c, errors.Join(errs...)
}

// Errors a caller may act on.
var (
	// ErrNotRunnable: run found nothing to claim under that id.
	ErrNotRunnable = errors.New("deletion request is not runnable, is blocked, or is leased by another executor")
	// ErrPermanent marks a failure no retry can fix; the request blocks.
	ErrPermanent = errors.New("permanent")
)

// permanent marks err as a failure no retry fixes.
func permanent(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrPermanent, fmt.Sprintf(format, args...))
}

// maxErrorBytes bounds a recorded error, cut at a UTF-8 boundary.
const maxErrorBytes = 4096

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut]
}
