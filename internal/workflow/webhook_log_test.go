package workflow_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/outage"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// A call the database failed is answered 503 "error: database
// unavailable; try again" (the caller sees no server message) and its
// cause goes to the log, naming the workflow and never the URL, which may
// carry the secret. Mutation killed: the 503 without the log line (the
// webhook logged nothing, so an operator saw 503s and no cause).
func TestWebhookDatabaseFailureIsLoggedWithoutTheSecret(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	hook := uuid.NewString()
	secret := f.saveHook(owner, ch, hook, "name: Hook\ntrigger: {on: webhook}\nsteps: [{id: say, action: send_message, text: hooked}]")

	gone, err := pgxpool.New(context.Background(), f.pool.Config().ConnString())
	require.NoError(t, err)
	gone.Close()
	var logged bytes.Buffer
	hooks := &workflow.Webhooks{Pool: gone, Clock: clock.Stub(f.clock.Now), Log: slog.New(slog.NewTextHandler(&logged, nil))}
	req := httptest.NewRequest(http.MethodPost, "/hooks/"+hook+"?secret="+secret, strings.NewReader(`{}`))
	req.SetPathValue("id", hook)
	rec := httptest.NewRecorder()
	hooks.Serve(rec, req, f.tenant.ID())

	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.JSONEq(t, `{"error":"error: database unavailable; try again"}`, rec.Body.String())
	require.Contains(t, logged.String(), "workflow webhook call failed")
	require.Contains(t, logged.String(), hook)
	require.NotContains(t, logged.String(), secret)
	require.Empty(t, f.runIDs(hook))
}

// A call failed by a server refusing the relay's login (a role without
// LOGIN, a password rotated under it) is answered as every other route
// answers it: 503 "error: database unavailable; try again" without
// Retry-After, since no wait ends a refused login, and logged by the
// outage log's bounded line, not the webhook's own. The outage log takes
// a refused login too, and the webhook set Retry-After for whatever the
// outage log took. The refusal is the server's, for real: the pool logs in
// as a role the test creates without LOGIN.
// Mutation killed: the webhook setting Retry-After whenever the outage log
// took the failure (the refused login is told to retry in a second).
func TestWebhookCallRefusedLoginIsAnsweredWithoutRetryAfter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	hook := uuid.NewString()
	secret := f.saveHook(owner, ch, hook, "name: Hook\ntrigger: {on: webhook}\nsteps: [{id: say, action: send_message, text: hooked}]")

	ctx := context.Background()
	role := "webhook_nologin_" + strings.ReplaceAll(uuid.NewString(), "-", "")
	_, err := f.pool.Exec(ctx, "CREATE ROLE "+role+" NOLOGIN")
	require.NoError(t, err)
	// Roles outlive the test database; f.pool's cleanup runs after this one.
	t.Cleanup(func() { _, _ = f.pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	cfg, err := pgxpool.ParseConfig(f.pool.Config().ConnString())
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	refused, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(refused.Close)

	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	hooks := &workflow.Webhooks{Pool: refused, Clock: clock.Stub(f.clock.Now), Log: log,
		Outage: outage.New(log, refused.Ping, f.clock.Now)}
	req := httptest.NewRequest(http.MethodPost, "/hooks/"+hook+"?secret="+secret, strings.NewReader(`{}`))
	req.SetPathValue("id", hook)
	rec := httptest.NewRecorder()
	hooks.Serve(rec, req, f.tenant.ID())

	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.JSONEq(t, `{"error":"error: database unavailable; try again"}`, rec.Body.String())
	require.Empty(t, rec.Header().Get("Retry-After"), "no wait ends a refused login")
	require.Contains(t, logged.String(), "refused the relay's login", logged.String())
	require.Contains(t, logged.String(), "SQLSTATE 28000", logged.String())
	require.NotContains(t, logged.String(), "workflow webhook call failed", "logged once, by the outage log")
	require.Empty(t, f.runIDs(hook))
}
