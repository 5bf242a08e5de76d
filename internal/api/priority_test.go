package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSubmit_Priority: "priority" is stored and carried in the job (submit, GET, event data);
// absent means normal; anything else is 400 invalid_priority and stores nothing.
func TestSubmit_Priority(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	ids := map[string]string{}
	for _, tc := range []struct{ field, want string }{{"", "normal"}, {`"priority":"high",`, "high"},
		{`"priority":"normal",`, "normal"}, {`"priority":"low",`, "low"}} {
		r := b.do(t, http.MethodPost, "/v1/jobs", `{`+tc.field+`"request":{"model":"m"}}`, nil)
		require.Equal(t, http.StatusAccepted, r.status, "%s: %v", tc.field, r.body)
		require.Equal(t, tc.want, r.body["priority"], tc.field)
		id := r.body["id"].(string)
		got := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", nil)
		require.Equal(t, tc.want, got.body["priority"], tc.field)
		ids[tc.want] = id
	}

	// The event stream's data is the job JSON: it carries the priority.
	s := openStream(t, b.url, ids["high"], "")
	defer s.close()
	f := s.nextEvent(t)
	var data map[string]any
	require.NoError(t, json.Unmarshal([]byte(f.data), &data))
	require.Equal(t, "high", data["priority"])

	for _, bad := range []string{`"urgent"`, `"HIGH"`, `""`, `" low"`, `"` + strings.Repeat("x", 500) + `"`} {
		r := b.do(t, http.MethodPost, "/v1/jobs", `{"priority":`+bad+`,"request":{"model":"m"}}`, nil)
		require.Equal(t, http.StatusBadRequest, r.status, bad)
		e := r.body["error"].(map[string]any)
		require.Equal(t, "invalid_priority", e["type"], bad)
		require.Contains(t, e["message"], "priority")
		require.Less(t, len(e["message"].(string)), 200, "the message quotes a long value cut short")
	}
	for _, bad := range []string{`1`, `null`, `["high"]`} {
		r := b.do(t, http.MethodPost, "/v1/jobs", `{"priority":`+bad+`,"request":{"model":"m"}}`, nil)
		if bad == `null` {
			// JSON null is the field left out: the default.
			require.Equal(t, http.StatusAccepted, r.status)
			require.Equal(t, "normal", r.body["priority"])
			continue
		}
		require.Equal(t, http.StatusBadRequest, r.status, bad)
		require.Equal(t, "invalid_field", r.body["error"].(map[string]any)["type"], bad)
	}
	var n int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM jobs`).Scan(&n))
	require.Equal(t, 5, n, "the refused submits stored nothing")
}
