package api

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tenant"
)

// serve sends one request straight to the handler (a panic fails the test) and returns the
// recorded answer.
func serve(t testing.TB, h http.Handler, method, path, body string, header map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequestWithContext(context.Background(), method, path, strings.NewReader(body))
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// checkClientAnswer is the property "client input never causes a 5xx": the answer is below 500,
// and a 4xx carries the error document with a type and a short message.
func checkClientAnswer(t testing.TB, rec *httptest.ResponseRecorder, what string) {
	t.Helper()
	if rec.Code >= 500 {
		t.Fatalf("%s: answered %d: %s", what, rec.Code, rec.Body.String())
	}
	if rec.Code < 400 {
		return
	}
	var doc struct {
		Error struct{ Type, Message string } `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || doc.Error.Type == "" || doc.Error.Message == "" {
		t.Fatalf("%s: %d without an error document: %q", what, rec.Code, rec.Body.String())
	}
	if len(doc.Error.Message) > maxMessageBytes+len("…") {
		t.Fatalf("%s: message of %d bytes", what, len(doc.Error.Message))
	}
}

func TestSubmit_InputLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxBody: 64 << 10})
	long := strings.Repeat("x", 20000)

	for _, tc := range []struct {
		name, body string
		header     map[string]string
		status     int
		typ        string
	}{
		{"BodyTooLarge", `{"request":{"model":"` + strings.Repeat("x", 70000) + `"}}`, nil, 413, "body_too_large"},
		{"InvalidUTF8", "{\"request\":{\"model\":\"\xff\"}}", nil, 400, "invalid_json"},
		{"MetadataNUL", `{"request":{"model":"m"},"metadata":{"a":"\u0000"}}`, nil, 400, "invalid_body"},
		{"MetadataLoneSurrogate", `{"request":{"model":"m"},"metadata":{"a":"\ud800"}}`, nil, 400, "invalid_body"},
		{"MetadataTooLarge", `{"request":{"model":"m"},"metadata":{"a":"` + strings.Repeat("m", 17<<10) + `"}}`, nil, 400, "invalid_metadata"},
		{"LongCredentialName", `{"credential":"` + long + `","request":{"model":"m"}}`, nil, 400, "unknown_credential"},
		{"LongFieldName", `{"` + long + `":1,"request":{"model":"m"}}`, nil, 400, "unknown_field"},
		{"LongIdempotencyKey", minimalSubmit, map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, 400, "invalid_idempotency_key"},
		{"NonASCIIIdempotencyKey", minimalSubmit, map[string]string{"Idempotency-Key": "clé"}, 400, "invalid_idempotency_key"},
		{"EmptyIdempotencyKey", minimalSubmit, map[string]string{"Idempotency-Key": ""}, 400, "invalid_idempotency_key"},
		{"TrailingBrace", `{"request":{"model":"m"}}}`, nil, 400, "invalid_json"},
		{"TrailingBracket", `{"request":{"model":"m"}} ]`, nil, 400, "invalid_json"},
		{"TrailingObject", `{"request":{"model":"m"}} {}`, nil, 400, "invalid_json"},
		{"DeepNesting", `{"request":{"a":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}}`, nil, 400, "invalid_json"},
		{"LongToken", minimalSubmit, map[string]string{"Authorization": "Bearer " + long}, 401, "unauthorized"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := serve(t, b.srv, http.MethodPost, "/v1/jobs", tc.body, tc.header)
			checkClientAnswer(t, rec, tc.name)
			require.Equal(t, tc.status, rec.Code, rec.Body.String())
			require.Contains(t, rec.Body.String(), `"type":"`+tc.typ+`"`)
		})
	}
	t.Run("IdempotencyKeyTwice", func(t *testing.T) {
		t.Parallel()
		req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/jobs", strings.NewReader(minimalSubmit))
		req.Header.Add("Idempotency-Key", "k1")
		req.Header.Add("Idempotency-Key", "k2")
		rec := httptest.NewRecorder()
		b.srv.ServeHTTP(rec, req)
		checkClientAnswer(t, rec, "IdempotencyKeyTwice")
		require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
		require.Contains(t, rec.Body.String(), `"type":"invalid_idempotency_key"`)
	})
	t.Run("LongLastEventID", func(t *testing.T) {
		t.Parallel()
		id := b.create(t, "").ID
		rec := serve(t, b.srv, http.MethodGet, "/v1/jobs/"+id+"/events", "", map[string]string{"Last-Event-ID": long})
		checkClientAnswer(t, rec, "LongLastEventID")
		require.Equal(t, http.StatusBadRequest, rec.Code)
	})
	t.Run("RequestThatIsNoObjectIs400", func(t *testing.T) {
		t.Parallel()
		for _, req := range []string{`[{"model":"m"}]`, `"hi"`, `42`, `true`, ` []`} {
			rec := serve(t, b.srv, http.MethodPost, "/v1/jobs", `{"request":`+req+`}`, nil)
			checkClientAnswer(t, rec, req)
			require.Equal(t, http.StatusBadRequest, rec.Code, req)
			require.Contains(t, rec.Body.String(), `"type":"invalid_request"`, req)
		}
		rec := serve(t, b.srv, http.MethodPost, "/v1/jobs", `{"request": {"model":"m"} }`, nil)
		require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	})
	t.Run("EscapesPostgresCannotReadBackAre400", func(t *testing.T) {
		t.Parallel()
		// The json column would store them, but any request->>'...' query on the table would fail.
		for _, req := range []string{`{"model":"m\u0000"}`, `{"\u0000":1}`, `{"a":["\ud800"]}`, `{"a":"\udc00\ud800"}`, `{"a":"\uD800x"}`} {
			rec := serve(t, b.srv, http.MethodPost, "/v1/jobs", `{"request":`+req+`}`, nil)
			checkClientAnswer(t, rec, req)
			require.Equal(t, http.StatusBadRequest, rec.Code, req)
			require.Contains(t, rec.Body.String(), `"type":"invalid_request"`, req)
		}
		// An escaped backslash before "u0000" is text, and a surrogate pair is one character.
		for _, req := range []string{`{"model":"m\\u0000"}`, `{"model":"\ud83d\ude00\uD83D\uDE00"}`, `{"model":"\u0001\\"}`} {
			rec := serve(t, b.srv, http.MethodPost, "/v1/jobs", `{"request":`+req+`}`, nil)
			require.Equal(t, http.StatusAccepted, rec.Code, req+": "+rec.Body.String())
		}
	})
	t.Run("SubMillisecondDurationsAre400", func(t *testing.T) {
		t.Parallel()
		for _, extra := range []string{`"timeout":"1ns"`, `"timeout":"999us"`, `"timeout":"999µs"`, `"timeout":"0.5ms"`,
			`"attempt_timeout":"999us"`, `"first_byte_timeout":"1ns"`, `"attempt_timeout":"1ms","first_byte_timeout":"999999ns"`} {
			rec := serve(t, b.srv, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"},`+extra+`}`, nil)
			checkClientAnswer(t, rec, extra)
			require.Equal(t, http.StatusBadRequest, rec.Code, extra)
			require.Contains(t, rec.Body.String(), `"type":"invalid_timeout"`, extra)
		}
		rec := serve(t, b.srv, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"},"timeout":"1ms","attempt_timeout":"1ms","first_byte_timeout":"1ms"}`, nil)
		require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	})
}

// TestSubmit_LongValuesKeepTheirMessage: a 400 that quotes a client's long value (a timeout, a
// credential, a priority, a lane) quotes it cut short, so that what the message says after it (the
// form the field takes, that the credential is not configured) is not lost to the message's cap;
// a cut never splits a character.
func TestSubmit_LongValuesKeepTheirMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	long := strings.Repeat("x", 5000)
	wide := "x" + strings.Repeat("é", 100) // a cut at an even byte count splits an é
	const req = `"request":{"model":"m","max_tokens":8,"messages":[]}`
	for _, tc := range []struct{ name, body, typ, msg string }{
		{"Timeout", `{"timeout":"` + long + `",` + req + `}`, "invalid_timeout", `must be a duration such as "10m"`},
		{"AttemptTimeout", `{"attempt_timeout":"` + long + `",` + req + `}`, "invalid_timeout", `must be a duration such as "30s"`},
		{"FirstByteTimeout", `{"first_byte_timeout":"` + long + `",` + req + `}`, "invalid_timeout", `must be a duration such as "30s"`},
		{"Credential", `{"credential":"` + long + `",` + req + `}`, "unknown_credential", `is not configured`},
		{"Fallback", `{"fallbacks":["` + long + `"],` + req + `}`, "unknown_credential", `is not configured`},
		{"WidePriority", `{"priority":"` + wide + `",` + req + `}`, "invalid_priority", `…" must be "high", "normal" or "low"`},
		{"WideLane", `{"lane":"` + wide + `",` + req + `}`, "invalid_lane", `…" must be "online", "batch" or "auto"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := b.do(t, "POST", "/v1/jobs", tc.body, nil)
			require.Equal(t, 400, r.status, "%v", r.body)
			e := r.body["error"].(map[string]any)
			require.Equal(t, tc.typ, e["type"])
			require.Contains(t, e["message"], tc.msg)
			require.NotContains(t, e["message"], `\x`, "a cut split a character")
			require.Less(t, len(e["message"].(string)), 300, "the message quotes a long value cut short")
		})
	}
	t.Run("LastEventID", func(t *testing.T) {
		id := b.create(t, "").ID
		r := b.do(t, "GET", "/v1/jobs/"+id+"/events", "", map[string]string{"Last-Event-ID": long})
		require.Equal(t, 400, r.status, "%v", r.body)
		e := r.body["error"].(map[string]any)
		require.Equal(t, "invalid_last_event_id", e["type"])
		require.Contains(t, e["message"], `must be an event id of this stream`)
	})
}

// TestServer_IDFormsAre404: uuid.Parse accepts forms of a job's ID that the store does not
// (urn:uuid:, braces, no hyphens); on every route that takes an ID each is a 404, never a 500.
func TestServer_IDFormsAre404(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	job := b.create(t, "")
	for _, id := range []string{"urn:uuid:" + job.ID, "URN:UUID:" + job.ID, "{" + job.ID + "}", strings.ReplaceAll(job.ID, "-", ""),
		"urn:uuid:0190a5b2-7c1e-7d3f-9a8b-123456789abc"} {
		for _, rt := range []struct{ method, path string }{
			{http.MethodGet, "/v1/jobs/" + id}, {http.MethodDelete, "/v1/jobs/" + id}, {http.MethodGet, "/v1/jobs/" + id + "/events"},
		} {
			r := b.do(t, rt.method, rt.path, "", nil)
			requireError(t, r, http.StatusNotFound, "not_found")
		}
	}
	got, err := b.store.Get(context.Background(), job.ID)
	require.NoError(t, err)
	require.Equal(t, "queued", string(got.Status), "no form of its ID canceled the job")
}

// TestServer_ClientInputNever5xx is the property over the whole handler: a few hundred requests
// mutated from valid ones (bodies, Idempotency-Keys, Authorization headers, paths, Last-Event-IDs)
// never get a 5xx, never panic, and every 4xx carries the error document. The mutations come from
// a fixed seed, so a failure reproduces; FuzzServer_Submit explores further under -fuzz.
func TestServer_ClientInputNever5xx(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxBody: 16 << 10, credentials: []string{"default", "other"}})
	valid := b.newTenant(t, "acme", "default")
	revoked := b.newTenant(t, "gone")
	_, err := b.tenants.Revoke(context.Background(), "gone")
	require.NoError(t, err)
	existing := b.create(t, "").ID

	rng := rand.New(rand.NewPCG(6, 6))
	auths := []map[string]string{nil, valid, revoked, {"Authorization": "Bearer x"}, {"Authorization": ""},
		{"Authorization": "Bearer " + tenant.BearerTokenPrefix + strings.Repeat("A", 43)}, {"Authorization": "Bearer \x7f\x01"}}
	keys := []string{"", "k-1", "k-1", strings.Repeat("k", 256), "a b", "\x00", "ключ", "k\x7f"}
	ids := []string{existing, "x", "", "0190a5b2-7c1e-7d3f-9a8b-123456789abc", "%00", "../../metrics", strings.Repeat("9", 5000)}
	for i := range 400 {
		h := map[string]string{}
		for k, v := range auths[rng.IntN(len(auths))] {
			h[k] = v
		}
		switch i % 5 {
		case 0, 1, 2:
			if k := keys[rng.IntN(len(keys))]; k != "" {
				h["Idempotency-Key"] = k
			}
			body := randomSubmit(rng)
			if i%2 == 0 {
				body = mutate(rng, submitSeeds[rng.IntN(len(submitSeeds))])
			}
			checkClientAnswer(t, serve(t, b.srv, http.MethodPost, "/v1/jobs", body, h), "POST "+body)
		case 3:
			path := "/v1/jobs/" + urlSafe(ids[rng.IntN(len(ids))])
			method := []string{http.MethodGet, http.MethodDelete, http.MethodPut}[rng.IntN(3)]
			checkClientAnswer(t, serve(t, b.srv, method, path, "", h), method+" "+path)
		case 4:
			id := ids[1+rng.IntN(len(ids)-1)] // not the existing job: its stream would stay open
			h["Last-Event-ID"] = []string{"", "0", "-1", "1e3", "x", strings.Repeat("9", 40)}[rng.IntN(6)]
			path := "/v1/jobs/" + urlSafe(id) + "/events"
			checkClientAnswer(t, serve(t, b.srv, http.MethodGet, path, "", h), "GET "+path)
		}
	}
}

// FuzzServer_Submit posts arbitrary bodies with arbitrary Idempotency-Key and Authorization
// headers to the whole handler (real Postgres and Redis): never a 5xx, never a panic, every 4xx
// with the error document. The committed corpus is in testdata/fuzz/FuzzServer_Submit.
func FuzzServer_Submit(f *testing.F) {
	b := setup(f, setupOpts{maxBody: 16 << 10, credentials: []string{"default", "other"}})
	_, token, err := b.tenants.Create(context.Background(), "acme", []string{"default"})
	require.NoError(f, err)
	for _, s := range submitSeeds {
		f.Add([]byte(s), "", "")
	}
	f.Add([]byte(submitSeeds[0]), "key-1", "Bearer "+token)
	f.Fuzz(func(t *testing.T, body []byte, key, auth string) {
		h := map[string]string{}
		if key != "" {
			h["Idempotency-Key"] = key
		}
		if auth != "" {
			h["Authorization"] = auth
		}
		checkClientAnswer(t, serve(t, b.srv, http.MethodPost, "/v1/jobs", string(body), h), "POST")
	})
}

// FuzzServer_Jobs sends GET, DELETE and GET .../events with arbitrary IDs, Last-Event-IDs and
// Authorization headers to the whole handler: never a 5xx, never a panic, every 4xx with the
// error document, and any ID but the job's own (in either case) names no job: an ID that
// uuid.Parse accepts in another form (urn:uuid:, braces, bare hex) is a 404. The committed
// corpus is in testdata/fuzz/FuzzServer_Jobs.
func FuzzServer_Jobs(f *testing.F) {
	b := setup(f, setupOpts{})
	job := b.create(f, "")
	// Canceled: a terminal job's stream ends after its last event instead of staying open.
	_, err := b.store.Cancel(context.Background(), job.ID)
	require.NoError(f, err)
	other := b.create(f, "someone-else").ID
	for _, id := range []string{job.ID, strings.ToUpper(job.ID), "urn:uuid:" + job.ID, "{" + job.ID + "}",
		strings.ReplaceAll(job.ID, "-", ""), other, "nope", "", "..", "../../metrics", job.ID + "/x"} {
		for m := range uint8(3) {
			f.Add(m, id, "", "")
		}
	}
	f.Add(uint8(2), job.ID, "0", "")
	f.Add(uint8(2), job.ID, "-1", "")
	f.Add(uint8(2), job.ID, "99999999999999999999", "")
	f.Add(uint8(0), job.ID, "", "Bearer x")
	f.Fuzz(func(t *testing.T, m uint8, id, lastEventID, auth string) {
		method, path := http.MethodGet, "/v1/jobs/"+url.PathEscape(id)
		switch m % 3 {
		case 1:
			method = http.MethodDelete
		case 2:
			path += "/events"
		}
		h := map[string]string{}
		if lastEventID != "" {
			h["Last-Event-ID"] = lastEventID
		}
		if auth != "" {
			h["Authorization"] = auth
		}
		rec := serve(t, b.srv, method, path, "", h)
		checkClientAnswer(t, rec, method+" "+path)
		if strings.EqualFold(id, job.ID) {
			return
		}
		if rec.Code < 300 {
			t.Fatalf("%s %s answered %d: %s", method, path, rec.Code, rec.Body.String())
		}
		if _, err := uuid.Parse(id); err == nil && auth == "" && rec.Code != http.StatusNotFound {
			t.Fatalf("%s %s answered %d, want 404: %s", method, path, rec.Code, rec.Body.String())
		}
	})
}

// FuzzServer_Durations submits arbitrary timeout, attempt_timeout and first_byte_timeout strings
// (an empty one is left out): never a 5xx, and a job is accepted only with durations of at
// least 1ms, which is what Postgres stores. The committed corpus is in
// testdata/fuzz/FuzzServer_Durations.
func FuzzServer_Durations(f *testing.F) {
	b := setup(f, setupOpts{})
	for _, d := range [][3]string{{"10m", "1m", "5s"}, {"1ns", "", ""}, {"999us", "", ""}, {"", "999us", ""}, {"", "", "1ns"},
		{"1ms", "1ms", "1ms"}, {"0.9999ms", "", ""}, {"-1s", "", ""}, {"24h0m0.000000001s", "", ""}, {"1e3s", "", ""}} {
		f.Add(d[0], d[1], d[2])
	}
	f.Fuzz(func(t *testing.T, timeout, attempt, firstByte string) {
		fields := []string{`"request":{"model":"m"}`}
		for name, v := range map[string]string{"timeout": timeout, "attempt_timeout": attempt, "first_byte_timeout": firstByte} {
			if v != "" {
				enc, _ := json.Marshal(v)
				fields = append(fields, `"`+name+`":`+string(enc))
			}
		}
		body := "{" + strings.Join(fields, ",") + "}"
		rec := serve(t, b.srv, http.MethodPost, "/v1/jobs", body, nil)
		checkClientAnswer(t, rec, "POST "+body)
		if rec.Code != http.StatusAccepted {
			return
		}
		for _, v := range []string{timeout, attempt, firstByte} {
			if d, err := time.ParseDuration(v); v != "" && (err != nil || d < time.Millisecond) {
				t.Fatalf("accepted %s", body)
			}
		}
	})
}

// submitSeeds are valid and nearly valid submit bodies that the property tests mutate.
var submitSeeds = []string{
	`{"request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}}`,
	`{"credential":"other","fallbacks":["default"],"request":{"model":"m"},"timeout":"1h","attempt_timeout":"1m","first_byte_timeout":"5s","max_attempts":3,"metadata":{"a":[1,{"b":null}]}}`,
	`{"credential":"default","request":{"model":"m","stream":false},"metadata":{}}`,
	`{"request":{"model":"m"},"metadata":{"k":"\u00e9\ud83d\ude00"}}`,
}

// randomSubmit builds a submit body that is valid JSON by construction (so that it reaches the
// validator and the store, where byte-level mutations rarely get), from random fields with
// troublesome values: \u0000, unpaired surrogates, raw invalid UTF-8, huge numbers, deep arrays,
// wrong types.
func randomSubmit(rng *rand.Rand) string {
	texts := []string{`"m"`, `"\u0000"`, `"\ud800"`, `"\udfff\ud800"`, "\"\xff\xfe\"", `"é😀"`, `""`, `"` + strings.Repeat("x", 2000) + `"`}
	values := append([]string{`null`, `true`, `0`, `-1`, `1e999`, `123456789012345678901234567890`, `1.5`, `[]`, `{}`,
		strings.Repeat("[", 300) + strings.Repeat("]", 300)}, texts...)
	object := func(depth int) string {
		var b strings.Builder
		b.WriteString("{")
		for j := range rng.IntN(4) {
			if j > 0 {
				b.WriteString(",")
			}
			b.WriteString(texts[rng.IntN(len(texts))] + ":" + values[rng.IntN(len(values))])
		}
		if depth > 0 && rng.IntN(2) == 0 {
			b.WriteString(`,"nested":{"a":` + values[rng.IntN(len(values))] + `}`)
		}
		b.WriteString("}")
		return strings.Replace(b.String(), "{,", "{", 1)
	}
	// Each field: values the validator accepts (where the trouble, if any, is inside strings),
	// then values it must refuse. Most picks are acceptable, so that most bodies reach the store.
	type field struct{ ok, bad []string }
	fields := map[string]field{
		"request":            {[]string{object(1), object(0), `{"model":"m","stream":false}`}, []string{`{"stream":true}`, `"hi"`, `null`}},
		"credential":         {[]string{`"default"`, `"other"`}, []string{`"nope"`, texts[rng.IntN(len(texts))], `7`}},
		"fallbacks":          {[]string{`[]`, `null`}, []string{`["other","other"]`, `[` + texts[rng.IntN(len(texts))] + `]`, `"other"`}},
		"timeout":            {[]string{`"1h"`, `"90s"`}, []string{`"0s"`, `"-1s"`, `"9999999999h"`, texts[rng.IntN(len(texts))], `60`}},
		"attempt_timeout":    {[]string{`"1m"`}, []string{`"2h"`, texts[rng.IntN(len(texts))]}},
		"first_byte_timeout": {[]string{`"1s"`}, []string{`"-1ms"`, texts[rng.IntN(len(texts))]}},
		"max_attempts":       {[]string{`1`, `100`}, []string{`101`, `0`, `-5`, `1e999`, `2.5`, `"3"`}},
		"metadata":           {[]string{object(1), object(0), `null`}, []string{`[1]`, `"x"`}},
		"priority":           {[]string{`"high"`, `"normal"`, `"low"`}, []string{`"urgent"`, `""`, `1`}},
		"colour":             {nil, []string{`"red"`}}, // unknown
	}
	var parts []string
	for name, f := range fields {
		if name != "request" && rng.IntN(3) != 0 || name == "colour" && rng.IntN(4) != 0 {
			continue
		}
		choices := f.ok
		if len(choices) == 0 || rng.IntN(8) == 0 {
			choices = f.bad
		}
		parts = append(parts, `"`+name+`":`+choices[rng.IntN(len(choices))])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// mutate applies one to four random edits to s: inserting a troublesome token, deleting or
// duplicating a span, or replacing a byte.
func mutate(rng *rand.Rand, s string) string {
	tokens := []string{`\u0000`, `\ud800`, `\udfff`, "\xff", "\x00", `"`, `{`, `}`, `[`, `]`, `,`, `:`, `null`, `true`,
		`1e999`, `-0`, `99999999999999999999`, `"stream":true,`, `"metadata":{"x":"\u0000"},`, `"fallbacks":["other","other"],`,
		`"credential":"` + strings.Repeat("c", 300) + `",`, `"timeout":"-5s",`, `"max_attempts":101,`, strings.Repeat("[", 200)}
	for range 1 + rng.IntN(4) {
		p := 0
		if len(s) > 0 {
			p = rng.IntN(len(s) + 1)
		}
		switch rng.IntN(4) {
		case 0:
			s = s[:p] + tokens[rng.IntN(len(tokens))] + s[p:]
		case 1:
			if p < len(s) {
				e := p + rng.IntN(len(s)-p) + 1
				s = s[:p] + s[e:]
			}
		case 2:
			if p < len(s) {
				e := p + rng.IntN(min(len(s)-p, 64)) + 1
				s = s[:p] + s[p:e] + s[p:]
			}
		case 3:
			if p < len(s) {
				s = s[:p] + string(rune(rng.IntN(256))) + s[p+1:]
			}
		}
	}
	return s
}

// urlSafe percent-encodes what httptest.NewRequest would refuse in a path.
func urlSafe(s string) string {
	return strings.NewReplacer("%", "%25", " ", "%20", "\x00", "%00").Replace(s)
}

// TestSubmit_IntegralMaxAttempts: max_attempts is an integer as api/openapi.yaml's JSON Schema
// reads one, a number without a fractional part however written (3.0 from a client whose
// numbers are floats, 3e0); a fraction, a string or a number past any int is still invalid_field.
func TestSubmit_IntegralMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, v := range []string{`3`, `3.0`, `3e0`, `0.3e1`, `300e-2`} {
		r := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"},"max_attempts":`+v+`}`, nil)
		require.Equal(t, http.StatusAccepted, r.status, "max_attempts %s: %v", v, r.body)
		require.EqualValues(t, 3, r.body["max_attempts"], "max_attempts %s", v)
	}
	for _, v := range []string{`2.5`, `"3"`, `1e999`, `1e19`, `-1e19`, `true`} {
		r := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"},"max_attempts":`+v+`}`, nil)
		requireError(t, r, http.StatusBadRequest, "invalid_field")
		require.Contains(t, r.body["error"].(map[string]any)["message"], `"max_attempts"`, "max_attempts %s", v)
	}
	for _, v := range []string{`1e2`, `100.0`} {
		r := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"},"max_attempts":`+v+`}`, nil)
		require.Equal(t, http.StatusAccepted, r.status, "max_attempts %s: %v", v, r.body)
	}
	for _, v := range []string{`101.0`, `0e5`, `-1.0`} {
		r := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"},"max_attempts":`+v+`}`, nil)
		requireError(t, r, http.StatusBadRequest, "invalid_max_attempts")
	}
	// A client retrying with the same body gets its replay; the fingerprint keeps numbers as
	// written (idem.Canonical), so 3 after 3.0 under one key is another body, as 3 and 3.0 in the
	// request the provider gets verbatim would be.
	key := map[string]string{"Idempotency-Key": "integral"}
	first := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"},"max_attempts":3.0}`, key)
	require.Equal(t, http.StatusAccepted, first.status, "%v", first.body)
	again := b.do(t, http.MethodPost, "/v1/jobs", `{"max_attempts": 3.0, "request":{"model":"m"}}`, key)
	require.Equal(t, http.StatusOK, again.status, "%v", again.body)
	require.Equal(t, first.body["id"], again.body["id"])
	requireError(t, b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"},"max_attempts":3}`, key), http.StatusUnprocessableEntity, "idempotency_key_reused")
}

// TestSubmit_ContentEncodingIs415: a body sent with a content coding (gzip, say) is refused with
// 415 naming the coding, and Accept-Encoding: identity (RFC 9110 §15.5.16): not a 400 that
// calls the compressed bytes invalid UTF-8. identity is no coding.
func TestSubmit_ContentEncodingIs415(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, err := w.Write([]byte(minimalSubmit))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	for _, coding := range []string{"gzip", "br", "deflate, gzip"} {
		r := b.do(t, http.MethodPost, "/v1/jobs", gz.String(), map[string]string{"Content-Encoding": coding})
		requireError(t, r, http.StatusUnsupportedMediaType, "unsupported_content_encoding")
		require.Equal(t, "identity", r.header.Get("Accept-Encoding"))
		require.Contains(t, r.body["error"].(map[string]any)["message"], coding)
	}
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM jobs").Scan(&n))
	require.Zero(t, n, "a compressed body stored a job")
	for _, coding := range []string{"identity", "IDENTITY", ""} {
		r := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, map[string]string{"Content-Encoding": coding})
		require.Equal(t, http.StatusAccepted, r.status, "Content-Encoding %q: %v", coding, r.body)
	}
}

// TestSubmit_MislabelledEncodingStillAccepted: a plain JSON body sent with a Content-Encoding that
// does not describe it (clients that confuse it with a charset, "UTF-8", or with
// Transfer-Encoding) was accepted by every earlier release. It still is, and so is its replay: a
// 415 would break such a client at the upgrade, and tell one whose first answer was lost (from an
// earlier replica in a rolling upgrade) that nothing was stored while its key holds a job.
func TestSubmit_MislabelledEncodingStillAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	first := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, map[string]string{"Idempotency-Key": "mislabelled"})
	require.Equal(t, http.StatusAccepted, first.status, "%v", first.body)
	for _, coding := range []string{"UTF-8", "chunked", "gzip"} {
		r := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, map[string]string{"Idempotency-Key": "mislabelled", "Content-Encoding": coding})
		require.Equal(t, http.StatusOK, r.status, "replay with Content-Encoding %q: %v", coding, r.body)
		require.Equal(t, first.body["id"], r.body["id"], "replay with Content-Encoding %q", coding)
		require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	}
	r := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, map[string]string{"Content-Encoding": "UTF-8"})
	require.Equal(t, http.StatusAccepted, r.status, "a plain body labelled UTF-8: %v", r.body)
	// A body that is no JSON as sent (UTF-8, say a short brotli stream) is the 415 all the same.
	r = b.do(t, http.MethodPost, "/v1/jobs", `{"request":`, map[string]string{"Content-Encoding": "br"})
	requireError(t, r, http.StatusUnsupportedMediaType, "unsupported_content_encoding")
	require.Equal(t, "identity", r.header.Get("Accept-Encoding"))
}
