package api

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestDecodeSubmitAnswers pins the answer to each kind of bad body as the decode gave it before
// its walk (scanSubmit): a client's 4xx text must not change with how the body is read.
func TestDecodeSubmitAnswers(t *testing.T) {
	c := newContract(SubmitConfig{Credentials: []string{"default"}, Kinds: map[string]string{"default": "anthropic"}})
	deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
	for _, tc := range []struct{ body, typ, msg string }{
		{"", "invalid_json", "body is not valid JSON: EOF"},
		{"   ", "invalid_json", "body is not valid JSON: EOF"},
		{"null", "missing_request", "field \"request\" is required: the provider-native request body"},
		{"[]", "invalid_body", "the body must be a JSON object, not an array"},
		{"\"x\"", "invalid_body", "the body must be a JSON object, not a string"},
		{"3", "invalid_body", "the body must be a JSON object, not a number"},
		{"true", "invalid_body", "the body must be a JSON object, not a boolean"},
		{"{", "invalid_json", "body is not valid JSON: unexpected EOF"},
		{"{\"request\":{}", "invalid_json", "body is not valid JSON: unexpected EOF"},
		{"{\"request\":{}}x", "invalid_json", "body has data after the JSON object"},
		{"{\"request\":{}} {}", "invalid_json", "body has data after the JSON object"},
		{"{\"request\":{}}\f", "invalid_json", "body has data after the JSON object"},
		{"{\"request\":{},}", "invalid_json", "body is not valid JSON: invalid character '}' looking for beginning of object key string"},
		{"{\"nope\":1,\"request\":{}}", "unknown_field", "unknown field \"nope\""},
		{"{\"request\":{},\"Nope\":1}", "unknown_field", "unknown field \"Nope\""},
		{"{\"Request\":{}}", "unknown_field", "unknown field \"Request\": field names are case-sensitive (did you mean \"request\"?)"},
		{"{\"request\":{},\"request\":{}}", "invalid_field", "field \"request\" appears twice: send it once"},
		{"{\"request\":{},\"credential\":\"a\",\"credential\":\"b\"}", "invalid_field", "field \"credential\" appears twice: send it once"},
		{"{\"credential\":5,\"request\":{}}", "invalid_field", "field \"credential\" must be a string"},
		{"{\"credential\":true,\"request\":{}}", "invalid_field", "field \"credential\" must be a string"},
		{"{\"credential\":{},\"request\":{}}", "invalid_field", "field \"credential\" must be a string"},
		{"{\"request\":{},\"timeout\":5}", "invalid_field", "field \"timeout\" must be a string"},
		{"{\"request\":{},\"lane\":[]}", "invalid_field", "field \"lane\" must be a string"},
		{"{\"request\":{},\"priority\":1}", "invalid_field", "field \"priority\" must be a string"},
		{"{\"request\":{},\"fallbacks\":\"a\"}", "invalid_field", "field \"fallbacks\" must be an array of strings"},
		{"{\"request\":{},\"fallbacks\":[1]}", "invalid_field", "field \"fallbacks\" must be an array of strings"},
		{"{\"request\":{},\"fallbacks\":{}}", "invalid_field", "field \"fallbacks\" must be an array of strings"},
		{"{\"request\":{},\"max_attempts\":\"3\"}", "invalid_field", "field \"max_attempts\" must be an integer"},
		{"{\"request\":{},\"max_attempts\":3.5}", "invalid_field", "field \"max_attempts\" must be an integer"},
		{"{\"request\":{},\"max_attempts\":1e400}", "invalid_field", "field \"max_attempts\" must be an integer"},
		{"{\"request\":{},\"max_attempts\":true}", "invalid_field", "field \"max_attempts\" must be an integer"},
		{"{\"request\":{},\"max_attempts\":9007199254740993}", "invalid_max_attempts", "max_attempts must be between 1 and 100 (got 9007199254740992)"},
		{"{\"request\":{},\"max_attempts\":01}", "invalid_json", "body is not valid JSON: invalid character '1' after object key:value pair"},
		{"{\"request\":{\"a\":tru}}", "invalid_json", "body is not valid JSON: invalid character '}' in literal true (expecting 'e')"},
		{"{\"request\":{\"a\":\"\x01\"}}", "invalid_json", "body is not valid JSON: invalid character '\\x01' in string literal"},
		{"{\"request\":{\"a\":\"\\x\"}}", "invalid_json", "body is not valid JSON: invalid character 'x' in string escape code"},
		{`{"request":` + deep + `}`, "invalid_json", "body is not valid JSON: invalid character '[' exceeded max depth"},
		{"{\"credential\":5,\"request\":{\"a\":}}", "invalid_json", "body is not valid JSON: invalid character '}' looking for beginning of value"},
		{"{\"credential\":5,\"nope\":1}", "invalid_field", "field \"credential\" must be a string"},
		// Several problems: the first in the body's order, but a max_attempts that is not an
		// integer before any (docs/api.md); a null fallback after them all.
		{`{"nope":1,"credential":5,"request":{}}`, "unknown_field", `unknown field "nope"`},
		{`{"nope":1,"credential":5,"max_attempts":"3","request":{}}`, "invalid_field", `field "max_attempts" must be an integer`},
		{`{"fallbacks":[null],"nope":1,"request":{}}`, "unknown_field", `unknown field "nope"`},
		{`{"fallbacks":[null],"request":{},"request":{}}`, "invalid_field", `field "request" appears twice: send it once`},
		{`{"fallbacks":[null],"credential":"nope"}`, "invalid_fallbacks", `fallbacks[0] is null: each fallback must be a credential's name`},
		{"{\"request\":{\"model\":\"m\",\"Stream\":true}}", "invalid_request", "field \"request.Stream\" must be spelled \"stream\": the provider reads field names exactly, and so does llmq"},
		{`{"request":{},"credential":"nope"}`, "unknown_credential", `credential "nope" is not configured`},
		{`{"request":{},"credential":"n\u00e9"}`, "unknown_credential", `credential "né" is not configured`},
		{`{"request":{},"fallbacks":[null]}`, "invalid_fallbacks", `fallbacks[0] is null: each fallback must be a credential's name`},
		{`{"request":{},"fallbacks":["default",null],"credential":"x"}`, "invalid_fallbacks", `fallbacks[1] is null: each fallback must be a credential's name`},
		{`{"request":{},"fallbacks":[""]}`, "unknown_credential", `fallback credential "" is not configured`},
		{`{"request":{},"credential":""}`, "unknown_credential", `credential "" is not configured`},
		{`{"credential":"","request":{},"credential":null}`, "invalid_field", `field "credential" appears twice: send it once`},
		// The request's names (checkFieldNames): in another case, escaped, repeated, nested, in
		// an array; the walk's body or the decode's.
		{`{"request":{"model":"m","Max_Tokens":5},"max_attempts":3}`, "invalid_request", `field "request.Max_Tokens" must be spelled "max_tokens": the provider reads field names exactly, and so does llmq`},
		{`{"request":{"model":"m","ſtream":true}}`, "invalid_request", `field "request.ſtream" must be spelled "stream": the provider reads field names exactly, and so does llmq`},
		{`{"request":{"max_to\u212aens":5}}`, "invalid_request", "field \"request.max_to\u212aens\" must be spelled \"max_tokens\": the provider reads field names exactly, and so does llmq"},
		{`{"request":{"model":"m","\u0073tream":true}}`, "invalid_request", `field "request.stream" must be spelled "stream", without escapes: llmq reads it as written`},
		{`{"request":{"model":"m","stream":false,"stream":true}}`, "invalid_request", `field "request.stream" appears twice: send it once`},
		{`{"Timeout":"1m","request":{"model":"m","model":"n"}}`, "unknown_field", `unknown field "Timeout": field names are case-sensitive (did you mean "timeout"?)`},
		{`{"timeout":"1m","timeout":"1m","request":{"model":"m","model":"n"}}`, "invalid_field", `field "timeout" appears twice: send it once`},
		{`{"\u0072equest":{"Model":"m"}}`, "invalid_request", `field "request.Model" must be spelled "model": the provider reads field names exactly, and so does llmq`},
		{`{"request":{"messages":[{"content":"a"},{"role":"user","CONTENT":"b"}]}}`, "invalid_request", `field "request.messages[1].CONTENT" must be spelled "content": the provider reads field names exactly, and so does llmq`},
		{`{"request":{"messages":[{"content":[{"type":"text","text":"a","text":"b"}]}]}}`, "invalid_request", `field "request.messages[0].content[0].text" appears twice: send it once`},
		{`{"request":{"messages":[{"content":[{"type":"tool_result","content":[{"type":"document","source":{"Data":"x"}}]}]}]}}`, "invalid_request", `field "request.messages[0].content[0].content[0].source.Data" must be spelled "data": the provider reads field names exactly, and so does llmq`},
		{`{"request":{"messages":[{"tool_calls":[{"function":{"name":"f","n\u0061me":"g"}}]}]}}`, "invalid_request", `field "request.messages[0].tool_calls[0].function.name" must be spelled "name", without escapes: llmq reads it as written`},
		{`{"request":{"system":[{"type":"text"},{"Text":"s"}]}}`, "invalid_request", `field "request.system[1].Text" must be spelled "text": the provider reads field names exactly, and so does llmq`},
		{`{"request":{"response_format":{"type":"json_schema","json_schema":{},"json_schema":{}}}}`, "invalid_request", `field "request.response_format.json_schema" appears twice: send it once`},
		{`{"request":[{"Stream":true}]}`, "invalid_request", `field "request[0].Stream" must be spelled "stream": the provider reads field names exactly, and so does llmq`},
		{`{"request":[1,{"model":"m"},{"MODEL":"m"}]}`, "invalid_request", `field "request[2].MODEL" must be spelled "model": the provider reads field names exactly, and so does llmq`},
		{`{"request":{"model":"m","metadata":{"Stream":1,"stream":1,"stream":2},"Stream":true}}`, "invalid_request", `field "request.Stream" must be spelled "stream": the provider reads field names exactly, and so does llmq`},
		{`{"request":{"stream":true,"metadata":{"STREAM":1}},"metadata":{"Stream":1},"credential":"nope"}`, "unknown_credential", `credential "nope" is not configured`},
		{`{"request":"x","credential":"default"}`, "invalid_request", `field "request" must be a JSON object`},
	} {
		_, err := c.parse("t", nil, "", []byte(tc.body))
		var inv *InvalidError
		if !errors.As(err, &inv) || inv.Type != tc.typ || inv.Message != tc.msg {
			t.Errorf("%.60q: got %v, want %s: %s", tc.body, err, tc.typ, tc.msg)
		}
	}
}

// TestDecodeSubmit_NullFallbackIsNamed: a null item of fallbacks is 400 invalid_fallbacks
// naming it, for a restricted tenant too (it was unknown_credential, or 403
// credential_not_allowed, for a fallback "" nobody sent); a fallback "" sent as a string is
// still a name, unknown.
func TestDecodeSubmit_NullFallbackIsNamed(t *testing.T) {
	c := newContract(SubmitConfig{Credentials: []string{"default", "backup"}})
	restricted := func(name string) bool { return name == "default" || name == "backup" }
	for _, allowed := range []func(string) bool{nil, restricted} {
		_, err := c.parse("t", allowed, "", []byte(`{"request":{},"fallbacks":["backup",null]}`))
		var inv *InvalidError
		if !errors.As(err, &inv) || inv.Status != 0 || inv.Type != "invalid_fallbacks" || !strings.Contains(inv.Message, "fallbacks[1] is null") {
			t.Errorf("restricted %v: got %#v, want 400 invalid_fallbacks naming fallbacks[1]", allowed != nil, err)
		}
	}
	_, err := c.parse("t", restricted, "", []byte(`{"request":{},"fallbacks":[""]}`))
	var inv *InvalidError
	if !errors.As(err, &inv) || inv.Type != "credential_not_allowed" {
		t.Errorf(`fallbacks [""] of a restricted tenant: got %v, want credential_not_allowed`, err)
	}
}

// FuzzScanSubmit checks decodeSubmit's walk against the decode it stands in for: a body the walk
// reads must decode to the same submitBody, and decodeSubmit's answer (result and error) must be
// the old decode's and the old names' check's (refCheckFieldNames) for every body; checkFieldNames,
// which decodeSubmit runs on the bodies the walk does not take, must answer as the old one.
func FuzzScanSubmit(f *testing.F) {
	for _, seed := range []string{
		`{"request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}}`,
		` {"credential":"oai","request":{"model":"gpt"},"timeout":"1h","max_attempts":3,"metadata":{"a":[1,2]}} `,
		`{"credential":"default","fallbacks":["backup", "x"],"request":{},"attempt_timeout":"30s","first_byte_timeout":"5s","lane":"batch","priority":"high"}`,
		`{"request":null,"metadata":null,"credential":null,"fallbacks":null,"max_attempts":null,"lane":null}`,
		`{"fallbacks":[],"request":{},"max_attempts":3.0}`,
		`{"credential":"\u00e9","request":{}}`,
		"{\"credential\":\"\xff\",\"request\":{}}",
		`{"Credential":"a","request":{}}`,
		`{"request":{},"request":{}}`,
		`{"request":{}} x`,
		`{"max_attempts":-0,"request":{}}`,
		`{"max_attempts":1e2,"request":{}}`,
		`{}`,
		`[]`,
		`{"request":{"model":"m","Max_Tokens":5,"stream":true,"stream":false},"max_attempts":3}`,
		`{"request":{"\u0073tream":true,"ſtream":1,"max_to\u212aens":2,"MODEL":"m"}}`,
		`{"request":{"messages":[{"role":"user","content":[{"type":"text","text":"a","Text":"b"}]},{"tool_calls":[{"function":{"name":"f","Name":"g"}}]}]}}`,
		`{"request":{"system":[{"type":"text","TYPE":"x"}],"response_format":{"json_schema":{},"JSON_schema":1}}}`,
		`{"request":{"messages":[{"content":[{"type":"tool_result","content":[{"source":{"type":"text","Data":"x"}}]},{"type":"document","source":{"type":"content","content":[{"source":{"data":"a","data":"b"}}]}}]}]}}`,
		`{"request":[{"Model":"m"},{"stream":1,"stream":2}],"metadata":{"Stream":1}}`,
		`{"Request":{"Stream":true},"request":{"stream":true}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		want, decodeErr := decodeSubmitJSON(body)
		wantErr := decodeErr
		if decodeErr == nil {
			wantErr = refCheckFieldNames(body)
			if got := checkFieldNames(body); !reflect.DeepEqual(got, wantErr) {
				t.Fatalf("%q: names' check %v, the old one's %v", body, got, wantErr)
			}
			if wantErr == nil && slices.Contains(want.Fallbacks, "") {
				wantErr = checkNullFallbacks(body)
			}
		}
		if got, ok := scanSubmit(body); ok {
			if decodeErr != nil {
				t.Fatalf("%q: the walk read what the decode refuses (%v)", body, decodeErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%q: walk %#v, decode %#v", body, got, want)
			}
		}
		got, gotErr := decodeSubmit(body)
		if !reflect.DeepEqual(gotErr, wantErr) {
			t.Fatalf("%q: error %v, the decode's %v", body, gotErr, wantErr)
		}
		if wantErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: %#v, the decode's %#v", body, got, want)
		}
	})
}

// TestScanSubmit_ReadsTheUsualBody checks the walk reads the bodies clients send (the gain is
// lost, silently, to the decode otherwise), and that an append to the request it returns does not
// write over the body.
func TestScanSubmit_ReadsTheUsualBody(t *testing.T) {
	for _, body := range []string{
		`{"request":{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}}`,
		`{"credential":"oai","fallbacks":["backup"],"request":{"model":"gpt","messages":[]},"timeout":"1h",` +
			`"attempt_timeout":"30s","first_byte_timeout":"5s","max_attempts":3,"metadata":{"a":1},"lane":"auto","priority":"low"}`,
		"{\n  \"request\": {\"model\": \"m\"},\n  \"metadata\": {\"k\": \"é\"}\n}\n",
	} {
		data := []byte(body)
		b, ok := scanSubmit(data)
		if !ok {
			t.Fatalf("%q: not walked", body)
		}
		if _ = append(b.Request, 'x'); string(data) != body {
			t.Fatalf("an append to the request wrote over the body: %q", data)
		}
		if want, _ := decodeSubmitJSON([]byte(body)); !reflect.DeepEqual(b, want) {
			t.Fatalf("%q: walk %#v, decode %#v", body, b, want)
		}
	}
}

// TestFieldSpecs_ChildrenAreNamed: checkMember looks a name's child spec up only for a name of
// spec.names, so every key of a spec's in must be one of its names.
func TestFieldSpecs_ChildrenAreNamed(t *testing.T) {
	seen := map[*fieldSpec]bool{}
	var walk func(spec *fieldSpec)
	walk = func(spec *fieldSpec) {
		if seen[spec] {
			return
		}
		seen[spec] = true
		for name, child := range spec.in {
			if !slices.Contains(spec.names, name) {
				t.Errorf("%q has a child spec but is not among %q", name, spec.names)
			}
			walk(child)
		}
	}
	walk(envelopeFields)
}

// TestParse_FallbackOfAnotherProviderIsNamed: a fallback whose provider is not the primary's is
// 400 invalid_fallbacks naming both credentials and their providers in plain words.
func TestParse_FallbackOfAnotherProviderIsNamed(t *testing.T) {
	c := newContract(SubmitConfig{Credentials: []string{"default", "oai"},
		Kinds: map[string]string{"default": "anthropic", "oai": "openai"}})
	_, err := c.parse("t", nil, "", []byte(`{"request":{},"fallbacks":["oai"]}`))
	var inv *InvalidError
	want := `fallback "oai" is of provider openai but "default" is of anthropic`
	if !errors.As(err, &inv) || inv.Type != "invalid_fallbacks" || !strings.HasPrefix(inv.Message, want) {
		t.Errorf("got %v, want invalid_fallbacks starting %q", err, want)
	}
}
