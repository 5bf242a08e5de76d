package llm

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// usageCases are usage objects read fast and some that fall back to json.Unmarshal, each of
// which must read as json.Unmarshal reads it.
var usageCases = []string{
	``, `null`, `{}`, ` { } `, `"usage"`, `7`, `[1,2]`, `true`,
	`{"input_tokens":12,"output_tokens":34}`,
	`{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16}`,
	// A repeated key: the last value wins; a null leaves the one before.
	`{"input_tokens":5,"output_tokens":3,"input_tokens":7}`,
	`{"prompt_tokens":5,"prompt_tokens":null}`,
	`{"input_tokens":null,"output_tokens":-4}`,
	// An output count reported, reported as 0, absent, or null after a value (a *int's nil).
	`{"input_tokens":5}`, `{"prompt_tokens":5}`, `{"input_tokens":5,"output_tokens":0}`,
	`{"prompt_tokens":5,"completion_tokens":0}`, `{"output_tokens":3,"input_tokens":5,"output_tokens":null}`,
	`{"completion_tokens":3,"prompt_tokens":5,"completion_tokens":null}`, `{"output_tokens":null}`,
	// Nested objects, strings and literals of other keys are passed over.
	`{"input_tokens":5,"cache_creation_input_tokens":600,"cache_read_input_tokens":70,` +
		`"cache_creation":{"ephemeral_5m_input_tokens":600,"x":[1,{"y":"}]\"{"}]},"output_tokens":30,"service_tier":"standard"}`,
	`{"prompt_tokens":2006,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":null},"flag":true,"f":1.5e3}`,
	" {\n\t\"input_tokens\" : 1 ,\r\n \"output_tokens\":2 } ",
	// Keys json matches case-insensitively or through escapes; values it refuses for an int.
	`{"Input_Tokens":9,"output_tokens":2}`, `{"INPUT_TOKENS":9}`, `{"input_\u0074okens":9}`, `{"prompt_toKens":1}`,
	`{"input_tokens":1.5,"output_tokens":2}`, `{"input_tokens":"3","output_tokens":2}`, `{"input_tokens":1e2}`,
	`{"input_tokens":99999999999999999999,"output_tokens":2}`, `{"input_tokens":{"a":1},"output_tokens":2}`,
	`{"input_tokens":[1],"output_tokens":2}`, `{"input_tokens":true}`, `{"input_tokens":-0}`,
	`{"input_tokens":9223372036854775807}`, `{"input_tokens":-9223372036854775808}`,
	`{"prompt_tokens":3,"prompt_tokens":"x"}`, `{"prompt_tokens":"x","prompt_tokens":3}`,
	`{"ütf":1,"input_tokens":2}`, `{"a\"b":1,"input_tokens":2}`,
	// Our own marker (Usage.OutputUnreported) is no provider's: passed over, on either path.
	`{"input_tokens":5,"output_tokens":3,"output_unreported":true}`, `{"output_unreported":true}`,
	`{"input_tokens":5,"output_unreported":false}`, `{"Input_Tokens":5,"output_tokens":3,"output_unreported":true}`,
	// Malformed (never given: the answer was decoded first), read as json.Unmarshal reads it.
	`{"input_tokens":1`, `{"input_tokens":}`, `{"input_tokens"`, `{"input_tokens":1,}`, `{"input_tokens":1}x`, `{`,
}

// TestUsage_AsJSONUnmarshal: both dialects read every usage as a json.Unmarshal of it, as they
// did before they read it without one (issue 23): a repeated key's last value included.
func TestUsage_AsJSONUnmarshal(t *testing.T) {
	t.Parallel()
	for _, raw := range usageCases {
		requireUsageAsJSON(t, []byte(raw))
	}
}

// FuzzUsage: any usage object reads as a json.Unmarshal of it (valid JSON: what the dialects are
// given, decoded from an answer or marshaled from a stream's events).
func FuzzUsage(f *testing.F) {
	for _, raw := range usageCases {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) > 0 && !json.Valid(raw) {
			t.Skip()
		}
		requireUsageAsJSON(t, raw)
	})
}

func requireUsageAsJSON(t *testing.T, raw []byte) {
	t.Helper()
	var a struct {
		Usage
		Output *int `json:"output_tokens"`
	}
	_ = json.Unmarshal(raw, &a)
	require.Equal(t, a.withOutput(a.Output), anthropic{}.usage(raw), "anthropic %q", raw)
	var o struct {
		PromptTokens     int  `json:"prompt_tokens"`
		CompletionTokens *int `json:"completion_tokens"`
	}
	_ = json.Unmarshal(raw, &o)
	require.Equal(t, Usage{InputTokens: o.PromptTokens}.withOutput(o.CompletionTokens), openAI{}.usage(raw), "openai %q", raw)
}

// TestUsage_NoAllocations: reading an answer's usage allocates nothing (a json.Unmarshal of it
// did, each answer: issue 23).
func TestUsage_NoAllocations(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	anth := json.RawMessage(`{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":16,"service_tier":"standard"}`)
	oai := json.RawMessage(`{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16,"prompt_tokens_details":{"cached_tokens":0}}`)
	var a, o Usage
	allocs := testing.AllocsPerRun(50, func() {
		a = anthropic{}.usage(anth)
		o = openAI{}.usage(oai)
	})
	require.Zero(t, allocs)
	require.Equal(t, Usage{InputTokens: 12, OutputTokens: 16}, a)
	require.Equal(t, Usage{InputTokens: 7, OutputTokens: 9}, o)
}

// A provider's usage holding output_unreported (a key of our stored usage, never a provider's)
// does not mark its output unreported, on the path that decodes it with json.Unmarshal too (a
// key in upper case takes it there): its output count is what says.
func TestUsage_ProviderOutputUnreportedIsPassedOver(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		`{"input_tokens":5,"output_tokens":3,"output_unreported":true}`,
		`{"Input_Tokens":5,"output_tokens":3,"output_unreported":true}`,
	} {
		require.Equal(t, Usage{InputTokens: 5, OutputTokens: 3}, anthropic{}.usage(json.RawMessage(raw)), raw)
	}
	require.Equal(t, Usage{InputTokens: 5, OutputUnreported: true},
		anthropic{}.usage(json.RawMessage(`{"Input_Tokens":5,"output_unreported":false}`)))
	require.Equal(t, Usage{}, anthropic{}.usage(json.RawMessage(`{"Output_Unreported":true}`)))
}

// BenchmarkUsage: the read of each answer's usage, of both providers' usual usage objects.
func BenchmarkUsage(b *testing.B) {
	anth := json.RawMessage(`{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":16,"service_tier":"standard"}`)
	oai := json.RawMessage(`{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16,"prompt_tokens_details":{"cached_tokens":0}}`)
	b.Run("Anthropic", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if u := (anthropic{}).usage(anth); u.OutputTokens != 16 {
				b.Fatal(u)
			}
		}
	})
	b.Run("OpenAI", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if u := (openAI{}).usage(oai); u.OutputTokens != 9 {
				b.Fatal(u)
			}
		}
	})
}
