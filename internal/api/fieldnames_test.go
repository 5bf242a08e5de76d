package api

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSubmit_FieldNamesMatchExactly: Go's encoding/json, which decodes the submit body and reads
// the request's fields (deltastream.Requested for "stream", tokens.Count for max_tokens, model and
// the text), matches names in any case (Unicode folding: "ſtream" is "stream" to it) and keeps the
// last of duplicates, while a provider matches names exactly. A name llmq would read in another
// spelling than the provider, or twice, is refused (400 naming it); names llmq does not read are
// the provider's to judge.
func TestSubmit_FieldNamesMatchExactly(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	for _, tc := range []struct{ name, body, typ, field string }{
		// The envelope is llmq's contract: its schema has no "Credential" (additionalProperties:
		// false).
		{"EnvelopeCase", `{"request":{"model":"m"},"Credential":"default"}`, "unknown_field", `"Credential"`},
		{"EnvelopeRequestCase", `{"Request":{"model":"m"}}`, "unknown_field", `"Request"`},
		{"EnvelopeTwice", `{"request":{"model":"m"},"timeout":"1m","timeout":"2m"}`, "invalid_field", `"timeout"`},
		// The fields of the request llmq reads.
		{"StreamCase", `{"request":{"model":"m","Stream":true}}`, "invalid_request", `"request.Stream"`},
		{"MaxTokensCase", `{"request":{"model":"m","MAX_TOKENS":5}}`, "invalid_request", `"request.MAX_TOKENS"`},
		{"ModelCase", `{"request":{"Model":"m"}}`, "invalid_request", `"request.Model"`},
		{"MaxCompletionTokensCase", `{"request":{"model":"m","Max_Completion_Tokens":5}}`, "invalid_request", `"request.Max_Completion_Tokens"`},
		{"EscapedCase", `{"request":{"model":"m","\u0053tream":true}}`, "invalid_request", `"request.Stream"`},
		{"UnicodeFold", `{"request":{"model":"m","ſtream":true}}`, "invalid_request", `"request.ſtream"`},
		{"KelvinSign", `{"request":{"model":"m","max_to\u212aens":5}}`, "invalid_request", "\"request.max_to\u212aens\""},
		{"AfterEscapes", `{"request":{"a":"\\\"}{[\\","\\\"":"\\","b":[1e5,{"c":"]"}],"Stream":true}}`, "invalid_request", `"request.Stream"`},
		{"StreamTwice", `{"request":{"model":"m","stream":false,"stream":true}}`, "invalid_request", `"request.stream"`},
		{"StreamTwiceEscaped", `{"request":{"model":"m","stream":false,"stre\u0061m":true}}`, "invalid_request", `"request.stream"`},
		{"MaxTokensTwice", `{"request":{"model":"m","max_tokens":100000,"max_tokens":5}}`, "invalid_request", `"request.max_tokens"`},
		{"ContentCase", `{"request":{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","Content":"hi"}]}}`,
			"invalid_request", `"request.messages[1].Content"`},
		{"BlockTextTwice", `{"request":{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"long","TEXT":"x"}]}]}}`,
			"invalid_request", `"request.messages[0].content[0].TEXT"`},
		{"SystemBlockCase", `{"request":{"model":"m","system":[{"Type":"text","text":"a"}]}}`, "invalid_request", `"request.system[0].Type"`},
		// tools and a tool_result's content are counted as input (tokens.Count).
		{"ToolsCase", `{"request":{"model":"m","Tools":[]}}`, "invalid_request", `"request.Tools"`},
		{"ToolResultContentCase", `{"request":{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","Content":"x"}]}]}}`,
			"invalid_request", `"request.messages[0].content[0].Content"`},
		{"ToolResultBlockCase", `{"request":{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","Text":"x"}]}]}]}}`,
			"invalid_request", `"request.messages[0].content[0].content[0].Text"`},
		// tool calls and documents' text are counted as input too.
		{"ToolUseInputCase", `{"request":{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_use","Input":{}}]}]}}`,
			"invalid_request", `"request.messages[0].content[0].Input"`},
		{"DocumentDataTwice", `{"request":{"model":"m","messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","data":"x","data":"y"}}]}]}}`,
			"invalid_request", `"request.messages[0].content[0].source.data"`},
		{"DocumentInResultSourceTypeCase", `{"request":{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"document","source":{"type":"base64","Type":"text"}}]}]}]}}`,
			"invalid_request", `"request.messages[0].content[0].content[0].source.Type"`},
		{"DocumentContentSourceDeep", `{"request":{"model":"m","messages":[{"role":"user","content":[{"type":"document","source":{"type":"content","content":[{"type":"document","source":{"Data":"x"}}]}}]}]}}`,
			"invalid_request", `"request.messages[0].content[0].source.content[0].source.Data"`},
		{"ToolCallArgumentsCase", `{"request":{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","Arguments":"{}"}}]}]}}`,
			"invalid_request", `"request.messages[0].tool_calls[0].function.Arguments"`},
		{"ResponseFormatSchemaCase", `{"request":{"model":"m","response_format":{"type":"json_schema","JSON_Schema":{}}}}`,
			"invalid_request", `"request.response_format.JSON_Schema"`},
		{"ToolCallsCase", `{"request":{"model":"m","messages":[{"role":"assistant","Tool_Calls":[]}]}}`,
			"invalid_request", `"request.messages[0].Tool_Calls"`},
		// an OpenAI image's url and detail are counted as input too.
		{"ImageURLCase", `{"request":{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","Image_URL":{"url":"x"}}]}]}}`,
			"invalid_request", `"request.messages[0].content[0].Image_URL"`},
		{"ImageURLDetailTwice", `{"request":{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x","detail":"low","detail":"high"}}]}]}}`,
			"invalid_request", `"request.messages[0].content[0].image_url.detail"`},
		{"ImageURLURLCase", `{"request":{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"URL":"x"}}]}]}}`,
			"invalid_request", `"request.messages[0].content[0].image_url.URL"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := serve(t, b.srv, http.MethodPost, "/v1/jobs", tc.body, nil)
			checkClientAnswer(t, rec, tc.name)
			require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
			require.Contains(t, rec.Body.String(), `"type":"`+tc.typ+`"`)
			require.Contains(t, rec.Body.String(), `field \`+tc.field[:len(tc.field)-1]+`\"`)
		})
	}
	t.Run("NamesLlmqDoesNotReadAreTheProviders", func(t *testing.T) {
		t.Parallel()
		for _, req := range []string{
			`{"model":"m","Temperature":1,"temperature":0}`,
			`{"model":"m","messages":[{"role":"user","content":"Stream MAX_TOKENS","Role":"x"}]}`,
			`{"model":"m","metadata":{"Stream":true,"stream":1,"stream":2}}`,
			`{"model":"m","tools":[{"name":"x","input_schema":{"properties":{"Model":{},"model":{}}}}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"Media_Type":"x","media_type":"y"}}]}]}`,
			`{"model":"m","system":"Stream","messages":"not an array","max_tokens":[1,{"Stream":1}]}`,
		} {
			rec := serve(t, b.srv, http.MethodPost, "/v1/jobs", `{"request":`+req+`}`, nil)
			require.Equal(t, http.StatusAccepted, rec.Code, req+": "+rec.Body.String())
		}
	})
}
