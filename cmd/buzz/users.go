package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/buzzrelay/buzz/internal/nostr"
)

const (
	// maxUsersPubkeys bounds one --pubkey lookup.
	maxUsersPubkeys = 200
	// usersNameLimit is how many profiles a --name lookup reads; with
	// --owner the relay applies the owner before this limit.
	usersNameLimit = 100
)

const usersGetSynopsis = "users get [--pubkey HEX|NPUB]... | [--name TEXT] [--owner me|HEX|NPUB] [--format compact|json]"

// userJSON is one profile in compact form. The owner fields come from the
// relay's recorded owner (verified, not the profile's own claim); the
// owner's display name is the one it has in the same community.
type userJSON struct {
	Pubkey           string  `json:"pubkey"`
	DisplayName      *string `json:"display_name"`
	OwnerPubkey      *string `json:"owner_pubkey"`
	OwnerDisplayName *string `json:"owner_display_name"`
	OwnedByMe        bool    `json:"owned_by_me"`
}

// usersGet: buzz users get [--pubkey P]... | [--name TEXT] [--owner O].
// Without --pubkey or --name it reads the caller's own profile. With
// --owner only agents whose recorded owner is O come back: the relay
// applies the owner before its limit, and when nothing owned matches the
// answer is [], never a retry without the owner.
func usersGet(o *options, args []string) (action, error) {
	fs := o.flags("buzz users get")
	var pubkeys stringList
	fs.Var(&pubkeys, "pubkey", "profile to read (64-char hex or npub; repeatable, at most 200)")
	name := fs.String("name", "", "find profiles whose display_name or name contains TEXT (case-insensitive)")
	var owner *string
	fs.Func("owner", "Filter agents by verified owner (`me`, 64-char hex, or npub)", func(v string) error {
		owner = &v
		return nil
	})
	format := fs.String("format", "compact", "compact (pubkey, display_name, owner fields) or json (the whole profile plus the owner fields)")
	if _, err := command(fs, args, 0, 0, usersGetSynopsis); err != nil {
		return nil, err
	}
	if *format != "compact" && *format != "json" {
		return nil, usageErr("--format must be compact or json")
	}
	if len(pubkeys) > 0 && *name != "" {
		return nil, usageErr("--name and --pubkey cannot be combined")
	}
	if len(pubkeys) > maxUsersPubkeys {
		return nil, usageErr("at most %d --pubkey values", maxUsersPubkeys)
	}
	authors := make([]string, 0, len(pubkeys))
	for _, p := range pubkeys {
		hexKey, err := pubkeyArg("--pubkey", p)
		if err != nil {
			return nil, err
		}
		authors = append(authors, hexKey)
	}
	var ownerIsMe bool
	var ownerHex string
	if owner != nil {
		if *owner == "me" {
			ownerIsMe = true
		} else {
			var err error
			if ownerHex, err = pubkeyArg("--owner", *owner); err != nil {
				return nil, usageErr("--owner must be me, a 64-char hex pubkey or an npub, not %q", *owner)
			}
		}
	}
	return func(ctx context.Context) (any, error) {
		key, err := o.secretKey()
		if err != nil {
			return nil, err
		}
		me, err := resolveMe(o, key.PublicKeyHex())
		if err != nil {
			return nil, err
		}
		if ownerIsMe {
			ownerHex = me
		}
		filter := map[string]any{"kinds": []int{0}}
		switch {
		case *name != "":
			filter["search"] = *name
			filter["limit"] = usersNameLimit
		case len(authors) > 0:
			filter["authors"] = authors
		default:
			filter["authors"] = []string{key.PublicKeyHex()}
		}
		if ownerHex != "" {
			filter["agent_owner"] = ownerHex
		}
		raw, err := json.Marshal(filter)
		if err != nil {
			return nil, err
		}
		c, err := o.connect(ctx)
		if err != nil {
			return nil, err
		}
		events, err := c.Query(ctx, []json.RawMessage{raw})
		c.Close(ctx)
		if err != nil {
			return nil, err
		}
		compact := []userJSON{}
		full := []map[string]any{}
		for _, r := range events {
			fields := map[string]any{}
			_ = json.Unmarshal([]byte(r.Event.Content), &fields) // a malformed profile still has a pubkey
			if *name != "" && !nameMatches(fields, *name) {
				continue
			}
			u := userJSON{Pubkey: r.Event.PubKey, DisplayName: displayName(fields)}
			if err := recordedOwner(ctx, o, &u); err != nil {
				return nil, err
			}
			u.OwnedByMe = u.OwnerPubkey != nil && *u.OwnerPubkey == me
			compact = append(compact, u)
			fields["pubkey"] = u.Pubkey
			fields["owner_pubkey"] = u.OwnerPubkey
			fields["owner_display_name"] = u.OwnerDisplayName
			fields["owned_by_me"] = u.OwnedByMe
			full = append(full, fields)
		}
		if *format == "json" {
			return full, nil
		}
		return compact, nil
	}, nil
}

// pubkeyArg accepts a pubkey as 64 hex characters (any case) or an npub
// and returns it as lowercase hex.
func pubkeyArg(flag, v string) (string, error) {
	if strings.HasPrefix(strings.ToLower(v), "npub1") {
		key, err := nostr.DecodeNpub(v)
		if err != nil {
			return "", invalidErr("%s %q: %v", flag, v, err)
		}
		return hex.EncodeToString(key[:]), nil
	}
	if lower := strings.ToLower(v); nostr.IsHex64(lower) {
		return lower, nil
	}
	return "", invalidErr("%s must be a 64-char hex pubkey or an npub, not %q", flag, v)
}

// resolveMe is who "me" and owned_by_me refer to: the owner named in the
// agent's attestation (BUZZ_AUTH_TAG, a NIP-OA auth tag) when the CLI runs
// as an agent, so an agent asking for "my Honey" means its owner's; else
// the CLI's own pubkey.
func resolveMe(o *options, self string) (string, error) {
	att, err := o.authTag()
	if err != nil || att == nil {
		return self, err
	}
	if err := att.VerifyFor(self, time.Now().Unix()); err != nil {
		return "", configErr("BUZZ_AUTH_TAG: %v", err)
	}
	return att.Owner, nil
}

// recordedOwner fills u's owner fields from the relay's recorded owner
// (404: none recorded).
func recordedOwner(ctx context.Context, o *options, u *userJSON) error {
	status, body, err := signedGet(ctx, o, "/v1/users/"+u.Pubkey+"/recorded-owner")
	if err != nil {
		return err
	}
	switch status {
	case http.StatusOK:
		var rec struct {
			AgentOwnerPubkey string  `json:"agent_owner_pubkey"`
			OwnerDisplayName *string `json:"owner_display_name"`
		}
		if err := json.Unmarshal(body, &rec); err != nil || !nostr.IsHex64(rec.AgentOwnerPubkey) {
			return &ProtocolError{Msg: "relay sent a malformed recorded owner for " + u.Pubkey}
		}
		u.OwnerPubkey, u.OwnerDisplayName = &rec.AgentOwnerPubkey, rec.OwnerDisplayName
		return nil
	case http.StatusNotFound:
		return nil
	}
	return httpRefusal(status, body)
}

// displayName is a profile's display_name, else its name.
func displayName(fields map[string]any) *string {
	for _, k := range []string{"display_name", "name"} {
		if s, ok := fields[k].(string); ok && strings.TrimSpace(s) != "" {
			return &s
		}
	}
	return nil
}

// nameMatches: the relay's full-text search finds candidates; the lookup
// keeps profiles whose display_name or name contains text.
func nameMatches(fields map[string]any, text string) bool {
	want := strings.ToLower(text)
	for _, k := range []string{"display_name", "name"} {
		if s, ok := fields[k].(string); ok && strings.Contains(strings.ToLower(s), want) {
			return true
		}
	}
	return false
}
