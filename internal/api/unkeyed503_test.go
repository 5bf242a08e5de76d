package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestSubmit_UnavailableSaysAnUnkeyedJobMayBeStored: a submit whose store work Postgres does not
// answer in time (its job's insert held on the wire) is answered 503 unavailable, which may come
// after the job was committed. Without an Idempotency-Key, "retry shortly" invited a resend that
// makes (and pays for) a second job: the message says the job may have been stored and that only
// an Idempotency-Key makes a resend safe. With a key, a resend under it is the safe retry, and the
// message stays.
func TestSubmit_UnavailableSaysAnUnkeyedJobMayBeStored(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		header map[string]string
		stored bool // whether the message says the job may have been stored
	}{
		{"Unkeyed", nil, true},
		{"Keyed", map[string]string{"Idempotency-Key": "held"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
			b := setup(t, setupOpts{dbURL: viaProxy, noListener: true, storeTimeout: 2 * time.Second})
			insert := proxy.HoldStatement("INSERT INTO jobs (")
			defer insert.Release()

			r := post(t, b.url, minimalSubmit, tc.header)
			select {
			case <-insert.Reached():
			default:
				t.Fatalf("the submit's insert was not held: %d %v", r.status, r.body)
			}
			require.Equal(t, http.StatusServiceUnavailable, r.status, "%v", r.body)
			e := r.body["error"].(map[string]any)
			require.Equal(t, "unavailable", e["type"])
			msg := e["message"].(string)
			require.Contains(t, msg, "did not answer in time")
			if tc.stored {
				require.Contains(t, msg, "may have been stored")
				require.Contains(t, msg, "Idempotency-Key")
			} else {
				require.NotContains(t, msg, "may have been stored")
			}
		})
	}
}
