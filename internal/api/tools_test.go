package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tokens"
)

// TestSubmit_ToolsCountTowardTheTokenCheck: an agent's prompt is mostly tool results, and a
// request's tool definitions are input too; the provider counts both. A request whose tool
// results, or tools, exceed the credential's whole input-token limit can never be sent: it is
// request_too_large at submit (it was accepted, counted as the few bytes of its text blocks).
func TestSubmit_ToolsCountTowardTheTokenCheck(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credentials: []string{"claude", "oai"},
		kinds:       map[string]string{"claude": tokens.ProviderAnthropic, "oai": tokens.ProviderOpenAI},
		tokenLimits: map[string]tokens.Limits{"claude": {InputPerMinute: 1000}, "oai": {CombinedPerMinute: 1000}}})
	big := strings.Repeat("x", 8000) // 2,000 tokens
	for _, tc := range []struct{ name, body string }{
		{"ToolResult", `{"credential":"claude","request":{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[
			{"type":"tool_result","tool_use_id":"t1","content":"` + big + `"}]}]}}`},
		{"AnthropicTools", `{"credential":"claude","request":{"model":"m","max_tokens":10,"tools":[{"name":"f","description":"` + big + `",
			"input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"hi"}]}}`},
		{"OpenAITools", `{"credential":"oai","request":{"model":"m","max_tokens":10,"tools":[{"type":"function","function":{"name":"f",
			"description":"` + big + `"}}],"messages":[{"role":"user","content":"hi"}]}}`},
	} {
		r := b.do(t, "POST", "/v1/jobs", tc.body, nil)
		require.Equal(t, 400, r.status, "%s: %v", tc.name, r.body)
		e := r.body["error"].(map[string]any)
		require.Equal(t, "request_too_large", e["type"], tc.name)
		require.Contains(t, e["message"], "can never be sent", tc.name)
	}
	// A small result and small tools fit.
	r := b.do(t, "POST", "/v1/jobs", `{"credential":"claude","request":{"model":"m","max_tokens":10,"tools":[{"name":"f",
		"input_schema":{"type":"object"}}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]}}`, nil)
	require.Equal(t, 202, r.status, "%v", r.body)
	require.Equal(t, 1, countJobs(t, b, "default"))
}

// TestSubmit_TooLargeSaysTheAllowanceWasAssumed: a request without max_tokens reserves the
// default allowance (4,096); when that does not fit a configured output limit, the refusal says
// the request set none and what was assumed, rather than blaming a max_tokens it never sent.
func TestSubmit_TooLargeSaysTheAllowanceWasAssumed(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credentials: []string{"claude", "oai"},
		kinds:       map[string]string{"claude": tokens.ProviderAnthropic, "oai": tokens.ProviderOpenAI},
		tokenLimits: map[string]tokens.Limits{"claude": {OutputPerMinute: 1000}, "oai": {CombinedPerMinute: 1000}}})
	for _, tc := range []struct{ name, body, msg string }{
		{"Anthropic", `{"credential":"claude","request":{"model":"m","messages":[{"role":"user","content":"hi"}]}}`,
			"the request sets no max_tokens: 4096 assumed"},
		{"OpenAI", `{"credential":"oai","request":{"model":"m","n":2,"messages":[{"role":"user","content":"hi"}]}}`,
			"the request sets no max_completion_tokens or max_tokens: 4096 assumed per choice"},
	} {
		r := b.do(t, "POST", "/v1/jobs", tc.body, nil)
		require.Equal(t, 400, r.status, "%s: %v", tc.name, r.body)
		e := r.body["error"].(map[string]any)
		require.Equal(t, "request_too_large", e["type"], tc.name)
		require.Contains(t, e["message"], tc.msg, tc.name)
	}
	// A max_tokens that was sent is not said to be assumed.
	r := b.do(t, "POST", "/v1/jobs", `{"credential":"claude","request":{"model":"m","max_tokens":2000,"messages":[{"role":"user","content":"hi"}]}}`, nil)
	require.Equal(t, 400, r.status)
	require.NotContains(t, r.body["error"].(map[string]any)["message"], "assumed")
}

// TestSubmit_IndentedToolsAreNotTooLarge: a client that indents its tool definitions sends the
// same definitions as one that does not; the white space is not input the provider counts, so a
// request that fits the credential's input limit compact is accepted indented too.
func TestSubmit_IndentedToolsAreNotTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credentials: []string{"claude"},
		kinds:       map[string]string{"claude": tokens.ProviderAnthropic},
		tokenLimits: map[string]tokens.Limits{"claude": {InputPerMinute: 1000}}})
	// Definitions of under 4,000 bytes compact (fewer than 1,000 tokens) laid out with as much
	// indentation again.
	var props strings.Builder
	for i := range 60 {
		fmt.Fprintf(&props, `,
            "p%02d": {
                "type": "string",
                "description": "a parameter"
            }`, i)
	}
	tools := `[{"name": "f", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}` + props.String() + `}}}]`
	var compact bytes.Buffer
	require.NoError(t, json.Compact(&compact, []byte(tools)))
	require.Less(t, compact.Len(), 4000)
	require.Greater(t, len(tools), 4000) // as sent: more than the 1,000-token limit
	r := b.do(t, "POST", "/v1/jobs", `{"credential":"claude","request":{"model":"m","max_tokens":10,"tools":`+tools+`,
		"messages":[{"role":"user","content":"hi"}]}}`, nil)
	require.Equal(t, 202, r.status, "%v", r.body)
}
