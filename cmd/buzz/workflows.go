package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Workflow kinds used by the CLI.
const (
	kindWorkflowDefinition = 30620
	kindWorkflowTrigger    = 46020
	kindApprovalGrant      = 46030
	kindApprovalDeny       = 46031
)

type workflowJSON struct {
	ID        string `json:"id"`
	Channel   string `json:"channel"`
	Owner     string `json:"owner"`
	EventID   string `json:"event_id"`
	CreatedAt int64  `json:"created_at"`
	YAML      string `json:"yaml,omitempty"`
}

func workflowID(s string) (string, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return "", invalidErr("workflow id must be a UUID: %q", s)
	}
	return id.String(), nil
}

// readWorkflows reads stored kind 30620 definitions matching filter.
func readWorkflows(ctx context.Context, o *options, filter map[string]any, withYAML bool) ([]workflowJSON, error) {
	c, err := o.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	filter["kinds"] = []int{kindWorkflowDefinition}
	raw, _ := json.Marshal(filter)
	events, err := c.Query(ctx, []json.RawMessage{raw})
	if err != nil {
		return nil, err
	}
	out := []workflowJSON{}
	for _, r := range events {
		ev := r.Event
		w := workflowJSON{ID: ev.DTag(), Owner: ev.PubKey, EventID: ev.ID, CreatedAt: ev.CreatedAt}
		if h := ev.Tags.First("h"); h != nil {
			w.Channel = h[1]
		}
		if withYAML {
			w.YAML = ev.Content
		}
		out = append(out, w)
	}
	return out, nil
}

// workflowsList: buzz workflows list [CHANNEL_ID].
func workflowsList(o *options, args []string) (action, error) {
	pos, err := command(o.flags("buzz workflows list"), args, 0, 1, "workflows list [CHANNEL_ID]")
	if err != nil {
		return nil, err
	}
	filter := map[string]any{}
	if len(pos) == 1 {
		id, err := channelID(pos[0])
		if err != nil {
			return nil, err
		}
		filter["#h"] = []string{id}
	}
	return func(ctx context.Context) (any, error) { return readWorkflows(ctx, o, filter, false) }, nil
}

// workflowsShow: buzz workflows show WORKFLOW_ID (the signed YAML included).
func workflowsShow(o *options, args []string) (action, error) {
	pos, err := command(o.flags("buzz workflows show"), args, 1, 1, "workflows show WORKFLOW_ID")
	if err != nil {
		return nil, err
	}
	id, err := workflowID(pos[0])
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (any, error) {
		list, err := readWorkflows(ctx, o, map[string]any{"#d": []string{id}}, true)
		if err != nil {
			return nil, err
		}
		if len(list) == 0 {
			return nil, &cliError{code: "not_found", msg: "no stored definition for workflow " + id, exit: 3}
		}
		return list[0], nil
	}, nil
}

// workflowsTrigger: buzz workflows trigger WORKFLOW_ID prints the run id the
// relay created.
func workflowsTrigger(o *options, args []string) (action, error) {
	pos, err := command(o.flags("buzz workflows trigger"), args, 1, 1, "workflows trigger WORKFLOW_ID")
	if err != nil {
		return nil, err
	}
	id, err := workflowID(pos[0])
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (any, error) {
		return publishCommand(ctx, o, kindWorkflowTrigger, nostr.Tags{{"d", id}})
	}, nil
}

// workflowsDecide: buzz workflows approve|deny APPROVAL_REF.
func workflowsDecide(kind int, name string) commandFunc {
	return func(o *options, args []string) (action, error) {
		pos, err := command(o.flags("buzz workflows "+name), args, 1, 1, "workflows "+name+" APPROVAL_REF")
		if err != nil {
			return nil, err
		}
		ref := strings.ToLower(pos[0])
		if _, ok := nostr.DecodeHex32(ref); !ok {
			return nil, invalidErr("approval reference must be 64 hex characters")
		}
		return func(ctx context.Context) (any, error) {
			return publishCommand(ctx, o, kind, nostr.Tags{{"d", ref}})
		}, nil
	}
}

// publishCommand publishes a command event and returns the JSON of the
// relay's "response:" OK message. Each call is a new command (see
// publish), so a trigger repeated within one second starts a second run.
func publishCommand(ctx context.Context, o *options, kind int, tags nostr.Tags) (any, error) {
	p, err := publish(ctx, o, kind, "", tags, true)
	if err != nil {
		return nil, err
	}
	if p.duplicate {
		return nil, &ProtocolError{Msg: fmt.Sprintf("relay accepted command %s only as a duplicate, %d times: %s", p.ev.ID, maxResigns+1, p.msg)}
	}
	// The command has taken effect from here on: say so, so that a script
	// does not retry it (a second trigger is a second run).
	body, ok := strings.CutPrefix(p.msg, "response:")
	if !ok {
		return nil, &ProtocolError{Msg: fmt.Sprintf("relay accepted command %s (do not retry it) without a response: %s", p.ev.ID, p.msg)}
	}
	if !json.Valid([]byte(body)) {
		return nil, &ProtocolError{Msg: fmt.Sprintf("relay accepted command %s (do not retry it) but its response is not JSON: %.200q", p.ev.ID, body)}
	}
	return json.RawMessage(body), nil
}

// workflowsRuns: buzz workflows runs WORKFLOW_ID [--limit N] [--before T
// --before-id ID] reads the run history over NIP-98 HTTP.
func workflowsRuns(o *options, args []string) (action, error) {
	fs := o.flags("buzz workflows runs")
	limit := fs.Int("limit", 20, "runs per page (1-100)")
	before := fs.String("before", "", "cursor: the previous page's next.before (RFC3339)")
	beforeID := fs.String("before-id", "", "cursor: the previous page's next.before_id")
	pos, err := command(fs, args, 1, 1, "workflows runs WORKFLOW_ID [--limit 1-100] [--before T --before-id ID]")
	if err != nil {
		return nil, err
	}
	id, err := workflowID(pos[0])
	if err != nil {
		return nil, err
	}
	if *limit < 1 || *limit > 100 {
		return nil, invalidErr("--limit must be 1 to 100")
	}
	if (*before == "") != (*beforeID == "") {
		return nil, invalidErr("--before and --before-id go together")
	}
	if *before != "" {
		if _, err := time.Parse(time.RFC3339Nano, *before); err != nil {
			return nil, invalidErr("--before must be RFC3339, as the previous page's next.before")
		}
		if _, err := uuid.Parse(*beforeID); err != nil {
			return nil, invalidErr("--before-id must be a run id (UUID), as the previous page's next.before_id")
		}
	}
	q := url.Values{"limit": {strconv.Itoa(*limit)}}
	if *before != "" {
		q.Set("before", *before)
		q.Set("before_id", *beforeID)
	}
	return func(ctx context.Context) (any, error) {
		return httpGetSigned(ctx, o, "/workflows/"+id+"/runs?"+q.Encode())
	}, nil
}

// httpGetSigned sends a NIP-98 signed GET to the relay's HTTP side and
// returns its JSON body; any status but 200 is the relay refusing.
func httpGetSigned(ctx context.Context, o *options, pathAndQuery string) (any, error) {
	status, body, err := signedGet(ctx, o, pathAndQuery)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, httpRefusal(status, body)
	}
	if !json.Valid(body) {
		return nil, &ProtocolError{Msg: fmt.Sprintf("relay answered 200 with a body that is not JSON: %.200q", body)}
	}
	return json.RawMessage(body), nil
}

// maxHTTPBody bounds a relay's HTTP answer; a longer one is refused whole
// rather than cut into invalid JSON.
const maxHTTPBody = 8 << 20

// signedGet sends a NIP-98 signed GET and returns the status and body.
func signedGet(ctx context.Context, o *options, pathAndQuery string) (int, []byte, error) {
	relay, err := o.relayURL()
	if err != nil {
		return 0, nil, err
	}
	key, err := o.secretKey()
	if err != nil {
		return 0, nil, err
	}
	base := "http" + strings.TrimPrefix(relay, "ws")
	target := strings.TrimRight(base, "/") + pathAndQuery
	att, err := o.authTag()
	if err != nil {
		return 0, nil, err
	}
	// The attestation is signed into the request too: the relay records an
	// owner from the header only when the agent's own signature covers it.
	var signedTags []nostr.Tag
	if att != nil {
		signedTags = append(signedTags, att.Tag())
	}
	auth, err := nostr.HTTPAuthHeader(key, http.MethodGet, target, nil, time.Now(), signedTags...)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", auth)
	if att != nil {
		tag, err := json.Marshal(att.Tag())
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("X-Auth-Tag", string(tag))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHTTPBody+1))
	if err != nil {
		return 0, nil, err
	}
	if len(body) > maxHTTPBody {
		return 0, nil, &ProtocolError{Msg: fmt.Sprintf("relay answered %d with a body over %d MiB", resp.StatusCode, maxHTTPBody>>20)}
	}
	return resp.StatusCode, body, nil
}

// httpRefusal is the CLI error for a relay's non-200 JSON answer.
func httpRefusal(status int, body []byte) error {
	var e struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	return &cliError{code: "http_" + strconv.Itoa(status), msg: fmt.Sprintf("relay answered %d: %s", status, e.Error), exit: 3}
}
