package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/outbox"
)

// listenerJSON is the stable JSON shape of one operator listener in
// `listeners list`: its registrations and its undelivered outbox rows.
type listenerJSON struct {
	Listener string       `json:"listener"`
	Targets  []targetJSON `json:"targets"`
	Backlog  backlogJSON  `json:"backlog"`
}

type targetJSON struct {
	Pubkey    string    `json:"pubkey"`
	CreatedAt time.Time `json:"created_at"`
}

type backlogJSON struct {
	Pending         int64      `json:"pending"`
	Sending         int64      `json:"sending"`
	OldestCreatedAt *time.Time `json:"oldest_created_at"`
}

// runListeners manages operator-listener registrations directly, as the
// registration API does for a listener (an operator's repair tool: it does
// not check that LISTENER is configured in BUZZ_OPERATOR_LISTENERS).
func runListeners(ctx context.Context, verb string, rest []string, getenv func(string) string, out io.Writer) error {
	keys := make([][]byte, len(rest))
	for i, arg := range rest {
		b, err := hex.DecodeString(arg)
		if err != nil || len(b) != 32 {
			// A command line that cannot run (exit 2), as a bad host is
			// for communities: a script tells it from a database error.
			return usageError{reason: fmt.Sprintf("%q is not a 64-char hex public key", arg)}
		}
		keys[i] = b
	}
	switch {
	case verb == "list" && len(keys) <= 1:
	case (verb == "add" || verb == "remove") && len(keys) >= 2:
	default:
		return usageError{}
	}
	conn, err := connect(ctx, getenv)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := checkDatabase(ctx, conn, verb != "list"); err != nil {
		return err
	}
	q := db.New(conn)
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")

	switch verb {
	case "add":
		n, err := q.ListenerRegistrationsUpsert(ctx, db.ListenerRegistrationsUpsertParams{Listener: keys[0], Targets: keys[1:]})
		if err != nil {
			return err
		}
		return enc.Encode(map[string]any{"listener": hex.EncodeToString(keys[0]), "registered": n})
	case "remove":
		n, err := outbox.RemoveTargets(ctx, conn, keys[0], keys[1:])
		if err != nil {
			return err
		}
		return enc.Encode(map[string]any{"listener": hex.EncodeToString(keys[0]), "removed": n})
	}
	var only []byte
	if len(keys) == 1 {
		only = keys[0]
	}
	list, err := listListeners(ctx, q, only)
	if err != nil {
		return err
	}
	return enc.Encode(list)
}

// listListeners merges registrations and backlog per listener, in listener
// order; a listener with a backlog but no registration left still shows.
func listListeners(ctx context.Context, q *db.Queries, only []byte) ([]listenerJSON, error) {
	regs, err := q.ListenerRegistrationsList(ctx, only)
	if err != nil {
		return nil, err
	}
	backlog, err := q.OutboxBacklogByListener(ctx, only)
	if err != nil {
		return nil, err
	}
	list := []listenerJSON{}
	byKey := map[string]int{}
	entry := func(key []byte) *listenerJSON {
		k := hex.EncodeToString(key)
		i, ok := byKey[k]
		if !ok {
			i = len(list)
			byKey[k] = i
			list = append(list, listenerJSON{Listener: k, Targets: []targetJSON{}})
		}
		return &list[i]
	}
	for _, r := range regs {
		e := entry(r.ListenerPubkey)
		e.Targets = append(e.Targets, targetJSON{Pubkey: hex.EncodeToString(r.TargetPubkey), CreatedAt: r.CreatedAt})
	}
	for _, b := range backlog {
		e := entry(b.ListenerPubkey)
		e.Backlog = backlogJSON{Pending: b.Pending, Sending: b.Sending, OldestCreatedAt: &b.OldestCreatedAt}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Listener < list[j].Listener })
	return list, nil
}
