package api

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/idem"
	"github.com/llmq/llmq/internal/tokens"
)

// FuzzSubmit feeds the submit contract's parse (the submit decoder and validator) arbitrary bodies, tenants
// and Idempotency-Keys. For every input it must not panic, must refuse with an *InvalidError
// carrying a type and a message (never another error, which the API would answer with 500), and
// what it accepts must hold every documented limit. The committed corpus is in
// testdata/fuzz/FuzzSubmit; `go test` runs it with the seeds below.
func FuzzSubmit(f *testing.F) {
	creds := []string{"default", "oai", "backup"}
	s := newContract(SubmitConfig{
		Credentials: creds,
		Kinds:       map[string]string{"default": "anthropic", "backup": "anthropic", "oai": "openai"},
	})
	for _, seed := range []struct{ body, key string }{
		{`{"request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}}`, ""},
		{`{"credential":"oai","request":{"model":"gpt","messages":[]},"timeout":"1h","max_attempts":3,"metadata":{"a":1}}`, "order-42"},
		{`{"credential":"default","fallbacks":["backup"],"request":{},"attempt_timeout":"30s","first_byte_timeout":"5s"}`, "k"},
		{`{"request":{"stream":true}}`, ""},
		{`{"request":{"model":"m"},"metadata":[1]}`, ""},
		{`{"request":{"model":"m"}} {}`, ""},
		{`{"request":null}`, ""},
		{`{"request":{"model":"m"},"max_attempts":1e400}`, ""},
		{`{"request":{"model":"m"},"timeout":"-1s"}`, "has space"},
		{`{"request":{"model":"m"},"timeout":"999us"}`, ""},
		{`{"credential":"oai","request":{"model":"m"}}`, ""},
		{`{"request":{"model":"m","Stream":true,"MAX_TOKENS":5}}`, ""},
		{`{"request":{"model":"m","stream":true,"stream":false,"max_tokens":9,"max_tokens":5}}`, ""},
		{`{"request":{"model":"m","\u0073tream":true,"max_tok\u0065ns":5}}`, ""},
		{`{"request":{"model":"m","max_tokens":4096.0}}`, ""},
		{`{"credential":"oai","request":{"model":"m","max_tokens":5,"n":3}}`, ""},
		{`{"credential":"oai","request":{"model":"m","n":0}}`, ""},
	} {
		f.Add([]byte(seed.body), "default", seed.key)
	}
	// A contract that knows only "default": a tenant allowed only "default" must get from it
	// exactly the answers it gets from s, or it could learn which other names exist.
	onlyDefault := newContract(SubmitConfig{Credentials: []string{"default"}, Kinds: map[string]string{"default": "anthropic"}})
	allowDefault := func(c string) bool { return c == "default" }
	f.Fuzz(func(t *testing.T, body []byte, tenant, key string) {
		pr, errR := s.parse(tenant, allowDefault, key, body)
		pd, errD := onlyDefault.parse(tenant, allowDefault, key, body)
		if !reflect.DeepEqual(pr, pd) || !reflect.DeepEqual(errR, errD) {
			t.Fatalf("a restricted tenant tells configurations apart: %v / %v", errR, errD)
		}
		p, err := s.parse(tenant, nil, key, body)
		if err != nil {
			var inv *InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("error %T %v is not an *InvalidError", err, err)
			}
			if inv.Type == "" || inv.Message == "" {
				t.Fatalf("InvalidError without type or message: %#v", inv)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		var req map[string]json.RawMessage
		if err := json.Unmarshal(p.Request, &req); err != nil {
			t.Fatalf("accepted a request that is not an object: %q", p.Request)
		}
		// llmq reads the request as a provider does: names exactly, the last of duplicates.
		var stream bool
		_ = json.Unmarshal(req["stream"], &stream)
		if deltastream.Requested(p.Request) != stream {
			t.Fatalf("llmq reads stream %v in %q", !stream, p.Request)
		}
		if r, err := tokens.Count(tokens.ProviderAnthropic, p.Request); err == nil {
			want := tokens.DefaultMaxOutput
			if raw, ok := req["max_tokens"]; ok && string(raw) != "null" {
				var f float64 // the providers read 4096.0 as 4096
				_ = json.Unmarshal(raw, &f)
				want = int(f)
			}
			if r.MaxOutput != want {
				t.Fatalf("llmq reads max_tokens %d in %q, the provider %d", r.MaxOutput, p.Request, want)
			}
		}
		// An OpenAI request's n multiplies the output reserved: llmq reads the n the provider does.
		if r, err := tokens.Count(tokens.ProviderOpenAI, p.Request); err == nil {
			want := 1
			if raw, ok := req["n"]; ok && string(raw) != "null" {
				var f float64 // the providers read 3.0 as 3
				_ = json.Unmarshal(raw, &f)
				want = int(f)
			}
			if r.Choices != want {
				t.Fatalf("llmq reads n %d in %q, the provider %d", r.Choices, p.Request, want)
			}
		}
		var decoded any
		if err := json.Unmarshal(p.Request, &decoded); err != nil || hasNUL(decoded) {
			t.Fatalf("accepted a request holding \\u0000: %q", p.Request)
		}
		if p.Tenant != tenant || p.IdempotencyKey != key {
			t.Fatalf("tenant/key changed: %q %q", p.Tenant, p.IdempotencyKey)
		}
		if key != "" && idem.ValidateKey(key) != nil {
			t.Fatalf("accepted Idempotency-Key %q", key)
		}
		if !slices.Contains(creds, p.Credential) {
			t.Fatalf("accepted credential %q", p.Credential)
		}
		if len(p.Fallbacks) > MaxFallbacks {
			t.Fatalf("accepted %d fallbacks", len(p.Fallbacks))
		}
		for i, fb := range p.Fallbacks {
			if !slices.Contains(creds, fb) || fb == p.Credential || slices.Contains(p.Fallbacks[:i], fb) {
				t.Fatalf("accepted fallbacks %q for %q", p.Fallbacks, p.Credential)
			}
		}
		if p.MaxAttempts < 1 || p.MaxAttempts > 100 {
			t.Fatalf("accepted max_attempts %d", p.MaxAttempts)
		}
		// Durations are stored in whole milliseconds: a set one must be at least 1ms.
		if p.Timeout < time.Millisecond || p.Timeout > 24*time.Hour || p.AttemptTimeout < 0 || p.AttemptTimeout > p.Timeout ||
			p.FirstByteTimeout < 0 || p.FirstByteTimeout > p.Timeout ||
			(p.AttemptTimeout > 0 && p.AttemptTimeout < time.Millisecond) || (p.FirstByteTimeout > 0 && p.FirstByteTimeout < time.Millisecond) {
			t.Fatalf("accepted timeouts %s / %s / %s", p.Timeout, p.AttemptTimeout, p.FirstByteTimeout)
		}
		if p.Metadata != nil && (len(p.Metadata) > MaxMetadataBytes || p.Metadata[0] != '{') {
			t.Fatalf("accepted metadata %q", p.Metadata)
		}
		if key == "" && p.Fingerprint != "" {
			t.Fatalf("fingerprint %q without a key to compare it for", p.Fingerprint)
		}
		if fp, err := idem.Fingerprint(body); key != "" && (err != nil || fp != p.Fingerprint) {
			t.Fatalf("fingerprint %q, want %q (%v)", p.Fingerprint, fp, err)
		}
		again, err := s.parse(tenant, nil, key, body)
		if err != nil || !reflect.DeepEqual(again, p) {
			t.Fatalf("Parse is not deterministic: %v", err)
		}
	})
}

// hasNUL reports whether a decoded JSON value holds U+0000 in a string or a key.
func hasNUL(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.ContainsRune(v, 0)
	case []any:
		return slices.ContainsFunc(v, hasNUL)
	case map[string]any:
		for k, e := range v {
			if strings.ContainsRune(k, 0) || hasNUL(e) {
				return true
			}
		}
	}
	return false
}
