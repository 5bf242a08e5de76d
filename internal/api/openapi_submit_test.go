package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/llmq/llmq/internal/openapitest"
)

// idempotencyKeySchema is the JSON pointer of the Idempotency-Key parameter's schema of POST
// /v1/jobs in api/openapi.yaml.
func idempotencyKeySchema(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../../api/openapi.yaml")
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]yaml.Node `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	var post struct {
		Parameters []struct {
			Name string `yaml:"name"`
		} `yaml:"parameters"`
	}
	node := doc.Paths["/v1/jobs"]["post"]
	require.NoError(t, node.Decode(&post))
	for i, p := range post.Parameters {
		if p.Name == "Idempotency-Key" {
			return fmt.Sprintf("#/paths/~1v1~1jobs/post/parameters/%d/schema", i)
		}
	}
	t.Fatal("POST /v1/jobs documents no Idempotency-Key parameter")
	return ""
}

// TestOpenAPI_IdempotencyKeyAgrees: the Idempotency-Key parameter's schema (its pattern, minLength
// and maxLength) accepts exactly the keys the server accepts: each key of the table is valid by
// the schema if and only if a submit under it is 202, else 400 invalid_idempotency_key.
func TestOpenAPI_IdempotencyKeyAgrees(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	spec := openapitest.Load(t)
	ptr := idempotencyKeySchema(t)
	for _, key := range []string{
		"a", "order-42", "~!#$%&'*+.^_`|", `"quoted"`, "{}[]()<>@,;:\\/?=", strings.Repeat("k", 255),
		"", strings.Repeat("k", 256), "two words", "tab\there", "caf\u00e9", "\u00e9",
	} {
		quoted, err := json.Marshal(key)
		require.NoError(t, err)
		schemaErr := spec.Validate(ptr, quoted)
		resp := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, map[string]string{"Idempotency-Key": key})
		if schemaErr == nil {
			require.Equal(t, http.StatusAccepted, resp.status, "key %q: valid by the schema, answered %v", key, resp.body)
			continue
		}
		require.Equal(t, http.StatusBadRequest, resp.status, "key %q: invalid by the schema (%v), answered %v", key, schemaErr, resp.body)
		require.Equal(t, "invalid_idempotency_key", errorType(resp), "key %q", key)
	}
}

// TestOpenAPI_SubmitBodyAgrees: the SubmitRequest schema states the server's rules for the body's
// optional fields: each body of the table is valid by the schema if and only if the server takes
// it (202), and refused (400) otherwise. A field sent as null is taken as absent, so the schema
// allows null for each optional field, and the job takes the field's default (the priority's
// default, normal, is what the schema says). Rules the schema cannot state are left out: a
// credential must be configured, a fallback must differ from the primary and share its provider.
func TestOpenAPI_SubmitBodyAgrees(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credentials: []string{"default", "backup", "spare"}})
	spec := openapitest.Load(t)
	raw, err := os.ReadFile("../../api/openapi.yaml")
	require.NoError(t, err)
	var doc struct {
		Components struct {
			Schemas struct {
				Priority struct {
					Default string `yaml:"default"`
				} `yaml:"Priority"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	defaultPriority := doc.Components.Schemas.Priority.Default
	require.Equal(t, "normal", defaultPriority, "Priority's default in api/openapi.yaml")
	for name, tc := range map[string]struct {
		fields   string // the body's fields after request
		wantType string // the 400's type when the schema refuses the body
		priority string // the job's priority when taken; default normal
	}{
		"Minimal":                {},
		"PriorityLow":            {fields: `"priority":"low"`, priority: "low"},
		"PriorityNull":           {fields: `"priority":null`},
		"PriorityUnknown":        {fields: `"priority":"urgent"`, wantType: "invalid_priority"},
		"LaneOnline":             {fields: `"lane":"online"`},
		"LaneNull":               {fields: `"lane":null`},
		"LaneUnknown":            {fields: `"lane":"sideways"`, wantType: "invalid_lane"},
		"Fallbacks":              {fields: `"fallbacks":["backup","spare"]`},
		"FallbacksNull":          {fields: `"fallbacks":null`},
		"FallbacksEmpty":         {fields: `"fallbacks":[]`},
		"FallbacksTwice":         {fields: `"fallbacks":["backup","backup"]`, wantType: "invalid_fallbacks"},
		"FallbacksOverMax":       {fields: `"fallbacks":["f1","f2","f3","f4","f5","f6"]`, wantType: "invalid_fallbacks"},
		"CredentialNull":         {fields: `"credential":null`},
		"CredentialEmpty":        {fields: `"credential":""`, wantType: "unknown_credential"},
		"FallbackEmpty":          {fields: `"fallbacks":[""]`, wantType: "unknown_credential"},
		"TimeoutNull":            {fields: `"timeout":null`},
		"AttemptTimeoutNull":     {fields: `"attempt_timeout":null`},
		"FirstByteTimeoutNull":   {fields: `"first_byte_timeout":null`},
		"MaxAttemptsNull":        {fields: `"max_attempts":null`},
		"MetadataNull":           {fields: `"metadata":null`},
		"MaxAttemptsOverMax":     {fields: `"max_attempts":101`, wantType: "invalid_max_attempts"},
		"MetadataNotAnObject":    {fields: `"metadata":[1]`, wantType: "invalid_metadata"},
		"RequestNull":            {fields: `"request":null`, wantType: "missing_request"},
		"UnknownField":           {fields: `"priorty":"low"`, wantType: "unknown_field"},
		"PriorityNotAString":     {fields: `"priority":1`, wantType: "invalid_field"},
		"FallbacksItemNotString": {fields: `"fallbacks":[null]`, wantType: "invalid_fallbacks"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			body := `{"request":{"model":"m"}}`
			switch {
			case strings.HasPrefix(tc.fields, `"request"`):
				body = "{" + tc.fields + "}"
			case tc.fields != "":
				body = `{"request":{"model":"m"},` + tc.fields + "}"
			}
			schemaErr := spec.Validate("#/components/schemas/SubmitRequest", []byte(body))
			resp := b.do(t, http.MethodPost, "/v1/jobs", body, nil)
			if tc.wantType != "" {
				require.Error(t, schemaErr, "%s: the schema takes a body the server refuses", body)
				require.Equal(t, http.StatusBadRequest, resp.status, "%s: answered %v", body, resp.body)
				require.Equal(t, tc.wantType, errorType(resp), "%s", body)
				return
			}
			require.NoError(t, schemaErr, "%s: the schema refuses a body the server takes", body)
			require.Equal(t, http.StatusAccepted, resp.status, "%s: answered %v", body, resp.body)
			want := tc.priority
			if want == "" {
				want = defaultPriority
			}
			require.Equal(t, want, resp.body["priority"], "%s", body)
		})
	}
}

// errorType is the type of an error answer's body.
func errorType(resp response) string {
	e, _ := resp.body["error"].(map[string]any)
	typ, _ := e["type"].(string)
	return typ
}
