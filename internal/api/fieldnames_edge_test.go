package api

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/deltastream"
)

// TestDecodeSubmit_EdgeCases: the submit body's decode and checkFieldNames's scanner past the plain
// case. What it accepts, llmq reads as the provider does: "\u0073tream" is "stream" to the
// provider but not to a reader of raw bytes (refused, as other names llmq reads written with
// escapes); after the object only JSON's white space may follow (not a
// form feed or a no-break space); a BOM, deep nesting, numbers and escaped quotes before a name
// do not mislead the scanner.
func TestDecodeSubmit_EdgeCases(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat(`{"a":[`, 4000) + strings.Repeat(`]}`, 4000)
	for _, tc := range []struct{ name, body, typ string }{
		{"BOM", "\ufeff" + `{"request":{"model":"m"}}`, "invalid_json"},
		{"BOMInName", `{"request":{"model":"m","` + "\ufeff" + `Stream":true}}`, ""},
		{"TrailingNBSP", `{"request":{"model":"m"}}` + "\u00a0", "invalid_json"},
		{"TrailingFormFeed", `{"request":{"model":"m"}}` + "\f", "invalid_json"},
		{"TrailingNEL", `{"request":{"model":"m"}}` + "\u0085", "invalid_json"},
		{"TrailingNewline", `{"request":{"model":"m"}}` + "\r\n", ""},
		{"EscapedExact", `{"request":{"model":"m","\u0073tream":true}}`, "invalid_request"},
		{"EscapedBlockName", `{"request":{"model":"m","messages":[{"content":[{"type":"text","te\u0078t":"x"}]}]}}`, "invalid_request"},
		{"EscapedUnreadName", `{"request":{"model":"m","\u0073tream_x":true,"metadata":{"\u0073tream":1}},"metadata":{"\u0073":1}}`, ""},
		{"EscapedEnvelopeName", `{"\u0072equest":{"model":"m"}}`, ""},
		{"EscapedSlash", `{"request":{"model":"m","max\/tokens":1,"Stream":true}}`, "invalid_request"},
		{"BackslashRunsBeforeName", `{"request":{"x\\\\":"\\\\","y":"\\\"Stream\\\"","Stream":true}}`, "invalid_request"},
		{"Numbers", `{"request":{"model":"m","a":-0.5E-7,"b":[1e300,-0,2],"c":{"d":12345678901234567890},"stream":true,"max_tokens":7}}`, ""},
		{"NumberThenCase", `{"request":{"a":1,"b":2e5,"MAX_TOKENS":5}}`, "invalid_request"},
		{"DeepUnread", `{"request":{"model":"m","tools":` + deep + `,"Stream":true}}`, "invalid_request"},
		{"DeepInMessages", `{"request":{"model":"m","messages":[{"role":"user","content":"x","extra":` + deep + `}],"Stream":true}}`, "invalid_request"},
		{"ArraysOfArraysInMessages", `{"request":{"model":"m","messages":[[{"Content":1}]],"stream":true}}`, ""},
		{"InvalidUTF8Name", "{\"request\":{\"model\":\"m\",\"stre\xffam\":true}}", ""},
		{"WhitespaceEverywhere", " \r\n\t{ \"request\" : { \"model\" : \"m\" , \"Stream\" : true } } ", "invalid_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := decodeSubmit([]byte(tc.body))
			if tc.typ == "" {
				require.NoError(t, err)
				// llmq reads "stream" as the provider does: exactly, escapes decoded.
				var top map[string]json.RawMessage
				require.NoError(t, json.Unmarshal(b.Request, &top))
				require.Equal(t, string(top["stream"]) == "true", deltastream.Requested(b.Request), "%s", b.Request)
				return
			}
			var ie *InvalidError
			require.True(t, errors.As(err, &ie), "%v", err)
			require.Equal(t, tc.typ, ie.Type, ie.Message)
		})
	}
}

// TestCheckFieldNames_AllocationFree: the check runs on every submit, after the body's decode; it
// walks the body allocating nothing, whatever the request's shape: names are compared in place,
// the error's path is built only for an error, and the scanner stays on the stack (it held a
// slice of its own array once, which sent it to the heap: an allocation a submit).
func TestCheckFieldNames_AllocationFree(t *testing.T) {
	var msgs []string
	for range 200 {
		msgs = append(msgs, `{"role":"user","content":[{"type":"text","text":"a \"quoted\" word"},{"type":"image","source":{"type":"url"}}]}`)
	}
	request := `{"model":"m","max_tokens":1024,"cache_control_and_a_long_name_past_32_bytes":1,` +
		`"system":[{"type":"text","text":"s"}],"messages":[` + strings.Join(msgs, ",") + `]}`
	body := []byte(`{"credential":"default","request":` + request + `,"metadata":{"k":"v"}}`)
	require.NoError(t, checkFieldNames(body))
	allocs := testing.AllocsPerRun(20, func() { _ = checkFieldNames(body) })
	require.Zero(t, allocs, "allocations per check of a body of %d messages", len(msgs))
	req := []byte(request)
	require.NoError(t, checkRequestNames(req))
	allocs = testing.AllocsPerRun(20, func() { _ = checkRequestNames(req) })
	require.Zero(t, allocs, "allocations per check of a request of %d messages", len(msgs))
}

// TestFieldSpecs_FitPath: the scanner's path is a fixed array, a step for each object it enters
// under the envelope; the specs must not nest deeper than it holds.
func TestFieldSpecs_FitPath(t *testing.T) {
	t.Parallel()
	var depth func(spec *fieldSpec) int
	depth = func(spec *fieldSpec) int {
		d := 0
		for _, child := range spec.in {
			d = max(d, 1+depth(child))
		}
		return d
	}
	var s jsonScanner
	require.LessOrEqual(t, depth(envelopeFields), len(s.path))
}

// TestFieldSpecs_LowerCase: checkMember looks for a name spelled exactly before it folds it, and
// stops at the first: right only when no name of a spec folds to another (a name spelled exactly
// as one would otherwise be refused as another's other spelling).
func TestFieldSpecs_LowerCase(t *testing.T) {
	t.Parallel()
	var check func(spec *fieldSpec)
	check = func(spec *fieldSpec) {
		for i, name := range spec.names {
			require.Equal(t, strings.ToLower(name), name)
			require.True(t, isASCII([]byte(name)), name)
			for _, other := range spec.names[i+1:] {
				require.False(t, strings.EqualFold(name, other), "%q and %q", name, other)
			}
			require.Len(t, spec.children, len(spec.names)*min(len(spec.in), 1))
		}
		for name, child := range spec.in {
			require.Contains(t, spec.names, name)
			check(child)
		}
	}
	check(envelopeFields)
}
