package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestServer_BusyPoolIsA503: when every connection of the Postgres pool is taken (a burst, a
// stalled server), a submit, a poll and a cancel wait at most Config.StoreWait for one, then
// get 503 overloaded with Retry-After, instead of waiting as long as the client does (past the
// server's write timeout, which then cuts the connection without an answer). Such a 503 sent
// nothing to Postgres: the same Idempotency-Key, once connections are free, creates the job (202,
// not a replay), and no job was stored by the refused submits.
func TestServer_BusyPoolIsA503(t *testing.T) {
	t.Parallel()
	// The tenants' share of keyed submits (half the pool: one) raised past the burst's: this is
	// the pool's bound alone (a tenant's share: TestSubmit_OneTenantsKeyedFloodLeavesRoomForOthers).
	b := setup(t, setupOpts{dbURL: pgtest.URL(t) + "&pool_max_conns=2", noListener: true,
		storeWait: 200 * time.Millisecond, tenantTTL: time.Hour, maxKeyedSubmits: 100})
	ctx := context.Background()
	_, token, err := b.tenants.Create(ctx, "acme", nil)
	require.NoError(t, err)
	_, beta, err := b.tenants.Create(ctx, "beta", nil)
	require.NoError(t, err)
	body := `{"request":{"model":"m"}}`
	job := b.create(t, "")
	// The anonymous tenant's lookup is cached; acme's token is not yet.
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/jobs/"+job.ID, "", nil).status)

	held := make([]*pgxpool.Conn, 0, 2)
	for range 2 {
		c, err := b.pool.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	release := sync.OnceFunc(func() {
		for _, c := range held {
			c.Release()
		}
	})
	t.Cleanup(release)

	busy := func(t *testing.T, r response) {
		t.Helper()
		require.Equal(t, http.StatusServiceUnavailable, r.status, "body %v", r.body)
		require.Equal(t, "overloaded", r.body["error"].(map[string]any)["type"])
		require.NotEmpty(t, r.header.Get("Retry-After"))
	}
	start := time.Now()
	busy(t, b.do(t, http.MethodPost, "/v1/jobs", body, map[string]string{"Idempotency-Key": "k1"}))
	busy(t, b.do(t, http.MethodPost, "/v1/jobs", body, nil))
	busy(t, b.do(t, http.MethodPost, "/v1/jobs", body, map[string]string{"Authorization": "Bearer " + token}))
	busy(t, b.do(t, http.MethodGet, "/v1/jobs/"+job.ID, "", nil))
	busy(t, b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil))
	// A burst at once: the submits that queue behind each other (batched) are bounded too, and
	// so are those that wait for another's lookup of their token (beta's, not cached).
	const burst = 24
	codes := make(chan string, burst)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			switch i % 3 {
			case 0:
				codes <- submitCode(b.url, body, true, "")
			case 1:
				codes <- submitCode(b.url, body, false, "")
			default:
				codes <- submitCode(b.url, body, false, beta)
			}
		})
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		require.Equal(t, "503 overloaded", c)
	}
	t.Logf("answered in %v", time.Since(start))

	release()
	created := b.do(t, http.MethodPost, "/v1/jobs", body, map[string]string{"Idempotency-Key": "k1"})
	require.Equal(t, http.StatusAccepted, created.status, "the refused submit stored nothing")
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM jobs`).Scan(&n))
	require.Equal(t, 2, n, "the job made before, and the one just created")
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/jobs/"+job.ID, "", nil).status)
}

// submitCode posts body (with an Idempotency-Key of its own when keyed, as the token's tenant
// when one is given) and returns the answer's
// status and error type, or what went wrong; it gives up after 10s.
func submitCode(base, body string, keyed bool, token string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/jobs", strings.NewReader(body))
	if err != nil {
		return err.Error()
	}
	if keyed {
		req.Header.Set("Idempotency-Key", fmt.Sprintf("burst-%p", req))
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	typ := ""
	if i := strings.Index(string(raw), `"type":"`); i >= 0 {
		typ, _, _ = strings.Cut(string(raw[i+len(`"type":"`):]), `"`)
	}
	return fmt.Sprintf("%d %s", resp.StatusCode, typ)
}
