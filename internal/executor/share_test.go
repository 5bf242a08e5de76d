package executor_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
)

// heldProvider returns a provider on llmsim whose first call is held until release is closed
// (or the test ends), and a channel closed once that call arrived.
func heldProvider(t *testing.T) (p llm.Provider, arrived <-chan struct{}, release chan struct{}) {
	t.Helper()
	sim := llmsim.New(llmsim.Config{})
	first, in, out := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	first <- struct{}{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-first:
			close(in)
			select {
			case <-out:
			case <-r.Context().Done():
			}
		default:
		}
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-out:
		default:
			close(out)
		}
	})
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-share"})
	require.NoError(t, err)
	return p, in, out
}

// With Config.Slots, a tenant alone holds every slot but the reserve (of 2 slots: one): while
// its first call is in flight, its next delivery is deferred before the limiter and the attempt,
// with its reason and counted by tenant; once the call ended, its slot is back and the next
// delivery runs. In a deployment of a single tenant, the reserve costs nothing: both run.
func TestExecutor_TenantShareOfSlots(t *testing.T) {
	t.Parallel()
	for _, single := range []bool{false, true} {
		t.Run(map[bool]string{false: "SeveralTenants", true: "SingleTenant"}[single], func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := jobstest.New(t)
			p, arrived, release := heldProvider(t)
			reg := prometheus.NewRegistry()
			ex := executor.New(executor.Config{Store: b.Store, Metrics: executor.NewMetrics(reg),
				Upstreams: map[string]executor.Upstream{"sim": {Name: "sim", Kind: string(llm.KindAnthropic), Provider: p}},
				Slots:     2, SingleTenant: func() bool { return single }})
			create := func() *jobs.Job {
				job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "acme", Credential: "sim",
					Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
				require.NoError(t, err)
				return job
			}
			first, second := create(), create()
			done := make(chan error, 1)
			go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: first.ID}) }()
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the first call never reached the provider")
			}

			perr := ex.Process(ctx, dispatch.Delivery{JobID: second.ID})
			got, err := b.Store.Get(ctx, second.ID)
			require.NoError(t, err)
			if single {
				require.NoError(t, perr, "a single tenant takes every slot")
				require.Equal(t, jobs.StatusSucceeded, got.Status)
			} else {
				var df *dispatch.DeferError
				require.ErrorAs(t, perr, &df)
				require.Contains(t, df.Reason, "share of this worker's delivery slots")
				require.Less(t, time.Until(df.Until), 2*time.Second, "a short delay")
				require.Zero(t, got.Attempts, "no attempt counted")
				require.Nil(t, got.SlotSeq)
				require.NotNil(t, got.NextAttemptAt)
				require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(shareDeferralsOfAcme),
					"llmq_delivery_share_deferrals_total"))
			}

			close(release)
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("the held call never ended")
			}
			if !single {
				// The slot came back with the first delivery's end.
				// (A delivery back early sleeps out the job's short delay, as for any deferral.)
				dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				require.NoError(t, ex.Process(dctx, dispatch.Delivery{JobID: second.ID}))
				got, err := b.Store.Get(ctx, second.ID)
				require.NoError(t, err)
				require.Equal(t, jobs.StatusSucceeded, got.Status)
			}
		})
	}
}

const shareDeferralsOfAcme = `# HELP llmq_delivery_share_deferrals_total Deliveries deferred because their tenant held its share of the worker's delivery slots, by tenant.
# TYPE llmq_delivery_share_deferrals_total counter
llmq_delivery_share_deferrals_total{tenant="acme"} 1
`
