package console_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
)

// TestCredentials_ResumeQuotesTheName: a resume's refusals quote the credential's name (%q), as
// the console's other messages quote names: the name is the path's, any text, and was written
// as it came (a NUL was "no credential \u0000 in the config", a name with spaces read as words).
func TestCredentials_ResumeQuotesTheName(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Credential{Name: "unseen", Provider: "openai"})
	c := b.login(t)
	for _, tc := range []struct {
		path   string
		status int
		typ    string
		want   string
	}{
		{"/console/api/credentials/a%00b/resume", http.StatusNotFound, "not_found", `no credential "a\x00b" in the config`},
		{"/console/api/credentials/two%20words/resume", http.StatusNotFound, "not_found", `no credential "two words" in the config`},
		{"/console/api/credentials/unseen/resume", http.StatusConflict, "state_unknown", `no worker has started with credential "unseen" yet`},
	} {
		r, out := c.do(http.MethodPost, tc.path, nil, nil)
		requireError(t, r, out, tc.status, tc.typ)
		var e struct{ Error struct{ Message string } }
		require.NoError(t, json.Unmarshal([]byte(out), &e))
		require.Contains(t, e.Error.Message, tc.want, tc.path)
	}
}
