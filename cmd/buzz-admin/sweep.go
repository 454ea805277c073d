package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
)

// unknownSampleSize is how many unknown keys a sweep keeps.
const unknownSampleSize = 100

// knownKey reports whether key has one of the shapes the relay writes: a
// shared blob, or a sidecar or upload record of some community.
func knownKey(key string) bool {
	if media.IsBlobKey(key) {
		return true
	}
	for _, top := range []string{"_meta/", "_uploads/"} {
		if rest, ok := strings.CutPrefix(key, top); ok {
			id, _, _ := strings.Cut(rest, "/")
			c, err := uuid.Parse(id)
			if err != nil || c.String() != id {
				return false
			}
			_, _, ok := media.ClassifyCommunityKey(c, key)
			return ok
		}
	}
	return false
}

type sweepJSON struct {
	ID                 uuid.UUID `json:"id"`
	StartedAt          time.Time `json:"started_at"`
	CompletedAt        time.Time `json:"completed_at"`
	ListedObjects      int64     `json:"listed_objects"`
	UnknownObjectCount int64     `json:"unknown_object_count"`
	UnknownKeySample   []string  `json:"unknown_key_sample"`
}

var errSweepCap = errors.New("sweep object cap reached")

// sweep lists the whole object store and records how many keys fall
// outside the known shapes. It never gates a deletion: it tells an
// operator that something else writes into the bucket.
func sweep(ctx context.Context, q *db.Queries, getenv func(string) string, enc *json.Encoder) error {
	cfg, err := deletion.ConfigFromEnv(getenv)
	if err != nil {
		return err
	}
	svc, err := services(ctx, getenv, false)
	if err != nil {
		return err
	}
	defer svc.close()
	if svc.store == nil {
		return errors.New("no media store is configured (BUZZ_MEDIA_STORE / BUZZ_MEDIA_DIR)")
	}
	started := time.Now()
	var listed, unknown int64
	sample := []string{}
	err = svc.store.Walk(ctx, "", "", func(key string, _ int64) error {
		listed++
		if listed > cfg.SweepMaxObjects {
			return fmt.Errorf("%w: more than %d objects (BUZZ_DELETION_SWEEP_MAX_OBJECTS)", errSweepCap, cfg.SweepMaxObjects)
		}
		if !knownKey(key) {
			unknown++
			if len(sample) < unknownSampleSize {
				sample = append(sample, key)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	raw, _ := json.Marshal(sample)
	row, err := q.StorageTaxonomySweepInsert(ctx, db.StorageTaxonomySweepInsertParams{StartedAt: started, ListedObjects: listed,
		UnknownObjectCount: unknown, UnknownKeySample: raw})
	if err != nil {
		return err
	}
	if err := enc.Encode(sweepJSON{ID: row.ID, StartedAt: row.StartedAt, CompletedAt: row.CompletedAt, ListedObjects: listed,
		UnknownObjectCount: unknown, UnknownKeySample: sample}); err != nil {
		return err
	}
	if unknown > 0 {
		return exitError{code: exitRunFailed}
	}
	return nil
}
