package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSubmit_ConcurrentSameKeyOnTwoReplicas sends 200 identical submits with one Idempotency-Key
// at once, half to each of two API replicas on one database: one job is created (202), the 199
// others replay it (200, Idempotent-Replayed; one answered 429 too_many_submits on a loaded
// machine is sent again, as a client would), and the provider is called once.
func TestSubmit_ConcurrentSameKeyOnTwoReplicas(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	urls := []string{b.apiURL, b.replica(t)}
	body := anthropicBody("exactly once across replicas")

	const n = 200
	type answer struct {
		status   int
		replayed string
		id       string
		err      error
	}
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = func() answer {
				// One deadline for the request and its resends: a resend after a 429 comes
				// once the API waited its 5 s for a keyed-submit place, so a loaded machine's
				// few resends outlast a single request's requestTimeout.
				ctx, cancel := context.WithTimeout(b.ctx, 3*requestTimeout)
				defer cancel()
				for {
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, urls[i%2]+"/v1/jobs", strings.NewReader(body))
					if err != nil {
						return answer{err: err}
					}
					req.Header.Set("Idempotency-Key", "replicas-200")
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						return answer{err: err}
					}
					raw, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil {
						return answer{err: err}
					}
					if resp.StatusCode == http.StatusTooManyRequests {
						// A loaded machine holds the keyed submits past the keyed-submit
						// gate's wait: the client resends under its key, as the 429 asks.
						select {
						case <-ctx.Done():
							return answer{err: fmt.Errorf("429 %s, then %w", raw, ctx.Err())}
						case <-time.After(time.Second):
						}
						continue
					}
					var job struct {
						ID string `json:"id"`
					}
					if err := json.Unmarshal(raw, &job); err != nil {
						return answer{err: fmt.Errorf("decode %q: %w", raw, err)}
					}
					return answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed"), id: job.ID}
				}
			}()
		}()
	}
	close(start)
	wg.Wait()

	created, replayed := 0, 0
	for i, a := range answers {
		require.NoError(t, a.err, "request %d", i)
		require.NotEmpty(t, a.id, "request %d: status %d", i, a.status)
		require.Equal(t, answers[0].id, a.id, "request %d", i)
		switch a.status {
		case http.StatusAccepted:
			created++
			require.Empty(t, a.replayed)
		case http.StatusOK:
			replayed++
			require.Equal(t, "true", a.replayed)
		default:
			t.Fatalf("request %d: status %d", i, a.status)
		}
	}
	require.Equal(t, 1, created)
	require.Equal(t, n-1, replayed)

	job := b.waitTerminal(t, answers[0].id)
	require.Equal(t, "succeeded", job["status"])
	require.EqualValues(t, 1, job["attempts"])
	require.Equal(t, 1, b.countRows(t, "jobs"))
	require.Equal(t, 1, b.countRows(t, "idempotency_keys"))
	require.Equal(t, 1, b.sim.Stats().Requests, "one provider call")
}
