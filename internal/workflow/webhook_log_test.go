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
