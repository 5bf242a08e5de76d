package breaker_test

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/redistest"
)

// t0 is the injected clock's start.
var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

const (
	testID   = "sk-test-secret-key"
	testName = "main"
)

type testBundle struct {
	clock  *clocktest.Clock
	prefix string
	rdb    *redis.Client // a third client, for looking at keys
	reg    *prometheus.Registry
	cfg    breaker.Config // as given to both breakers, before defaults
	// creds[0] and creds[1] are the same credential over two Redis clients, as two processes
	// would have. Both record into one Metrics, so its counters count every transition once.
	creds [2]*breaker.Circuit
}

// setup returns the breaker of one credential over two Redis clients, on a fresh key prefix
// and an injected clock at t0; mod may adjust the config.
func setup(t *testing.T, mod func(*breaker.Config)) *testBundle {
	t.Helper()
	b := &testBundle{
		clock:  clocktest.New(t0),
		prefix: redistest.Prefix(t),
		rdb:    redistest.Client(t),
		reg:    prometheus.NewRegistry(),
	}
	b.cfg = breaker.Config{Prefix: b.prefix, Now: b.clock.Now, Metrics: breaker.NewMetrics(b.reg)}
	if mod != nil {
		mod(&b.cfg)
	}
	for i := range b.creds {
		cfg := b.cfg
		br, err := breaker.New(redistest.Client(t), &cfg)
		require.NoError(t, err)
		b.creds[i] = br.Circuit(testID, testName)
	}
	return b
}

// admit calls Allow on creds[i%2] and requires it to be allowed.
func (b *testBundle) admit(t *testing.T, i int) breaker.Admission {
	t.Helper()
	a, err := b.creds[i%2].Allow(t.Context())
	require.NoError(t, err)
	require.True(t, a.Allowed, "admission %+v", a)
	return a
}

// send admits a request on creds[i%2] and reports o for it, returning the state after.
func (b *testBundle) send(t *testing.T, i int, o breaker.Outcome) breaker.State {
	t.Helper()
	a := b.admit(t, i)
	st, err := b.creds[i%2].Report(t.Context(), a, o)
	require.NoError(t, err)
	return st
}

// open opens a closed breaker with Threshold failures and returns when it opened.
func (b *testBundle) open(t *testing.T) time.Time {
	t.Helper()
	n := b.cfg.Threshold
	if n == 0 {
		n = breaker.DefaultThreshold
	}
	for i := range n - 1 {
		require.Equal(t, breaker.Closed, b.send(t, i, breaker.Failure))
	}
	require.Equal(t, breaker.Open, b.send(t, n, breaker.Failure))
	return b.clock.Now()
}

// status reads the breaker's status through creds[0].
func (b *testBundle) status(t *testing.T) breaker.Status {
	t.Helper()
	s, err := b.creds[0].Status(t.Context())
	require.NoError(t, err)
	return s
}

// allow50 calls Allow from 50 goroutines spread over both clients at once and returns the
// answers.
func (b *testBundle) allow50(t *testing.T) []breaker.Admission {
	t.Helper()
	out := make([]breaker.Admission, 50)
	errs := make([]error, 50)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			<-start
			out[i], errs[i] = b.creds[i%2].Allow(t.Context())
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return out
}

// probes counts the allowed admissions, requiring every allowed one to be a probe, and returns
// the probe (zero if none).
func probes(t *testing.T, as []breaker.Admission) (int, breaker.Admission) {
	t.Helper()
	n, probe := 0, breaker.Admission{}
	for _, a := range as {
		if a.Allowed {
			require.True(t, a.Probe, "an allowed admission while half-open must be the probe")
			n++
			probe = a
		}
	}
	return n, probe
}

// metric returns the value of the metric name whose labels include want, or fails.
func (b *testBundle) metric(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			if m.Gauge != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0 // a counter never incremented is absent: zero
}

func (b *testBundle) transitions(t *testing.T, to breaker.State) int {
	t.Helper()
	return int(b.metric(t, "llmq_breaker_transitions_total", map[string]string{"credential": testName, "to": string(to)}))
}

func (b *testBundle) stateGauge(t *testing.T, s breaker.State) float64 {
	t.Helper()
	return b.metric(t, "llmq_breaker_state", map[string]string{"credential": testName, "state": string(s)})
}
