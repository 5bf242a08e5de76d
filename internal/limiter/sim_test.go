package limiter_test

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
)

// The simulation drives the limiter, on an injected clock, against an in-test provider: a token
// bucket that is full until the first request lands, with random network delay each way. It is
// the evidence that the design reaches the floor (capacity 20, refill 10/s, 100 jobs: 8.0 s)
// before the real benchmark, for a configured limit and for each header format when learned.

// resetFormat is how the simulated provider writes its reset header.
type resetFormat int

const (
	anthropicExact   resetFormat = iota // RFC 3339 with nanoseconds
	anthropicSeconds                    // RFC 3339 truncated to the second (Go's time.RFC3339)
	openaiMillis                        // duration rounded to the millisecond
	openaiSeconds                       // duration rounded up to the second
)

func (f resetFormat) String() string {
	return [...]string{"AnthropicExact", "AnthropicSeconds", "OpenAIMillis", "OpenAISeconds"}[f]
}

type simParams struct {
	jobs       int
	capacity   float64
	rate       float64
	configured bool
	format     resetFormat
	delayMin   time.Duration // one-way network delay, uniform in [delayMin, delayMax]
	delayMax   time.Duration
	processes  int
	seed       uint64
	skew       time.Duration // provider clock minus ours (absolute reset formats only)
	// change, when set, replaces the provider's bucket at changeAt.
	changeAt                   time.Duration
	changeCapacity, changeRate float64
}

type simResult struct {
	finish    time.Duration // last success received, from the herd's start
	requests  int           // requests the provider saw
	rejected  int           // 429s
	reserves  int           // Reserve calls
	succeeded int
	final     limiter.Limit // Current at the end
	source    limiter.Source
}

// simBucket is the provider's token bucket.
type simBucket struct {
	capacity, rate, tokens float64
	last                   time.Duration
}

func (b *simBucket) take(at time.Duration) (ok bool) {
	b.tokens = math.Min(b.capacity, b.tokens+b.rate*(at-b.last).Seconds())
	b.last = at
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

type simEvent struct {
	at   time.Duration
	seq  int
	kind int // 0 reserve, 1 send, 2 arrive, 3 response
	job  int
	sent time.Duration
	rseq int64
	code int
	hdr  http.Header
}

type simQueue []*simEvent

func (q simQueue) Len() int { return len(q) }
func (q simQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q simQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)   { *q = append(*q, x.(*simEvent)) }
func (q *simQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

func runSim(t *testing.T, p simParams) simResult {
	t.Helper()
	ctx := context.Background()
	// The epoch is off the whole second so that truncated reset headers lose a fraction.
	epoch := time.Date(2030, 1, 1, 0, 0, 0, 370_000_000, time.UTC)
	var clock time.Duration
	now := func() time.Time { return epoch.Add(clock) }
	prefix := redistest.Prefix(t)
	creds := make([]*limiter.Credential, p.processes)
	for i := range creds {
		l, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: prefix, Now: now})
		require.NoError(t, err)
		creds[i] = l.Credential("sk-sim", "sim")
	}
	lim := limiter.Limit{}
	if p.configured {
		lim = limiter.Limit{Rate: p.rate, Burst: int(p.capacity)}
	}
	rng := rand.New(rand.NewPCG(p.seed, 1))
	delay := func() time.Duration {
		return p.delayMin + time.Duration(rng.Int64N(int64(p.delayMax-p.delayMin)+1))
	}
	bucket := &simBucket{capacity: p.capacity, rate: p.rate, tokens: p.capacity}
	changed := false

	var q simQueue
	seq := 0
	push := func(e *simEvent) { seq++; e.seq = seq; heap.Push(&q, e) }
	for j := range p.jobs {
		push(&simEvent{at: 0, kind: 0, job: j})
	}
	var r simResult
	for q.Len() > 0 {
		e := heap.Pop(&q).(*simEvent)
		clock = e.at
		cred := creds[e.job%p.processes]
		switch e.kind {
		case 0:
			r.reserves++
			require.Less(t, r.reserves, 200*p.jobs, "too many Reserve calls")
			res, err := cred.Reserve(ctx, lim)
			require.NoError(t, err)
			at := res.SendAt.Sub(epoch)
			require.GreaterOrEqual(t, at, clock)
			if res.Granted {
				push(&simEvent{at: at, kind: 1, job: e.job, rseq: res.Seq})
			} else {
				require.Greater(t, at, clock, "an ungranted reservation must say when to ask again")
				push(&simEvent{at: at, kind: 0, job: e.job})
			}
		case 1:
			push(&simEvent{at: clock + delay(), kind: 2, job: e.job, sent: clock, rseq: e.rseq})
		case 2:
			if p.changeAt > 0 && !changed && clock >= p.changeAt {
				changed = true
				bucket.take(clock) // settle the refill so far
				bucket.capacity, bucket.rate = p.changeCapacity, p.changeRate
				bucket.tokens = math.Min(bucket.tokens, bucket.capacity)
			}
			r.requests++
			code := http.StatusOK
			if !bucket.take(clock) {
				code = http.StatusTooManyRequests
				r.rejected++
			}
			push(&simEvent{at: clock + delay(), kind: 3, job: e.job, sent: e.sent, rseq: e.rseq, code: code,
				hdr: simHeaders(p, bucket, epoch.Add(clock+p.skew), code)})
		case 3:
			o := limiter.ObservationFromHeaders(e.hdr, e.code, epoch.Add(e.sent), now())
			require.True(t, o.HeadersKnown)
			o.Seq = e.rseq
			require.NoError(t, cred.Observe(ctx, o))
			if e.code == http.StatusOK {
				r.succeeded++
				r.finish = max(r.finish, clock)
			} else {
				push(&simEvent{at: clock, kind: 0, job: e.job})
			}
		}
	}
	var err error
	r.final, r.source, err = creds[0].Current(ctx)
	require.NoError(t, err)
	return r
}

func simHeaders(p simParams, b *simBucket, providerNow time.Time, code int) http.Header {
	h := http.Header{}
	toFull := time.Duration((b.capacity - b.tokens) / b.rate * float64(time.Second))
	limit := strconv.Itoa(int(b.capacity))
	remaining := strconv.Itoa(int(math.Floor(b.tokens)))
	switch p.format {
	case anthropicExact, anthropicSeconds:
		layout := time.RFC3339Nano
		if p.format == anthropicSeconds {
			layout = time.RFC3339
		}
		h.Set(limiter.HeaderAnthropicLimit, limit)
		h.Set(limiter.HeaderAnthropicRemaining, remaining)
		h.Set(limiter.HeaderAnthropicReset, providerNow.Add(toFull).Format(layout))
	case openaiMillis, openaiSeconds:
		d := toFull.Round(time.Millisecond)
		if p.format == openaiSeconds {
			d = time.Duration(math.Ceil(toFull.Seconds())) * time.Second
		}
		h.Set(limiter.HeaderOpenAILimit, limit)
		h.Set(limiter.HeaderOpenAIRemaining, remaining)
		h.Set(limiter.HeaderOpenAIReset, d.String())
	}
	if code == http.StatusTooManyRequests {
		wait := (1 - b.tokens) / b.rate
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(wait))))
	}
	return h
}

func (r simResult) String() string {
	return fmt.Sprintf("finish %.3fs requests %d 429s %d reserves %d, final %s %+v",
		r.finish.Seconds(), r.requests, r.rejected, r.reserves, r.source, r.final)
}

// floor is the theoretical finish: the burst at once, the rest at the rate.
func (p simParams) floor() float64 { return (float64(p.jobs) - p.capacity) / p.rate }

func TestLimiter_SimulatedHerd(t *testing.T) {
	t.Parallel()
	// 100 jobs against capacity 20 refilled at 10/s: floor 8.0 s. 1-5 ms each way.
	base := simParams{jobs: 100, capacity: 20, rate: 10, processes: 2,
		delayMin: time.Millisecond, delayMax: 5 * time.Millisecond}
	// 1,000 jobs against capacity 100 refilled at 50/s over 8 processes: floor 18.0 s.
	big := base
	big.jobs, big.capacity, big.rate, big.processes = 1000, 100, 50, 8
	jittery := base
	jittery.delayMax = 60 * time.Millisecond

	for _, tc := range []struct {
		name  string
		p     simParams
		seeds uint64
	}{
		{"Configured", base, 3},
		{"ConfiguredJitter60ms", jittery, 3},
		{"ConfiguredBig", big, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for seed := range tc.seeds {
				p := tc.p
				p.configured, p.seed = true, seed
				r := runSim(t, p)
				t.Logf("seed %d: %v (%.3fx floor)", seed, r, r.finish.Seconds()/p.floor())
				require.Equal(t, p.jobs, r.succeeded)
				require.Equal(t, 0, r.rejected)
				require.Equal(t, p.jobs, r.requests)
				require.LessOrEqual(t, r.finish.Seconds(), 1.05*p.floor())
			}
		})
	}

	type learned struct {
		name  string
		p     simParams
		seeds uint64
		// max429 is the most 429s allowed (requests <= 1.1 x jobs in any case).
		max429 int
	}
	cases := []learned{}
	for _, f := range []resetFormat{anthropicExact, anthropicSeconds, openaiMillis, openaiSeconds} {
		p := base
		p.format = f
		cases = append(cases, learned{"Learned" + f.String(), p, 3, 0})
	}
	jittery.format = anthropicSeconds
	cases = append(cases, learned{"LearnedJitter60ms", jittery, 3, 0})
	big.format = anthropicSeconds
	cases = append(cases, learned{"LearnedBig", big, 1, 0})
	for _, skew := range []time.Duration{-300 * time.Millisecond, 300 * time.Millisecond} {
		// The provider's absolute reset times are off by skew: the rate is misjudged by up to
		// skew/2s, corrected by 429s and by what the provider says remains.
		p := base
		p.skew = skew
		cases = append(cases, learned{fmt.Sprintf("LearnedClockSkew%v", skew), p, 3, 5})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for seed := range tc.seeds {
				p := tc.p
				p.seed = seed
				r := runSim(t, p)
				t.Logf("seed %d: %v (%.3fx floor)", seed, r, r.finish.Seconds()/p.floor())
				require.Equal(t, p.jobs, r.succeeded)
				require.LessOrEqual(t, r.rejected, tc.max429)
				require.LessOrEqual(t, float64(r.requests), 1.1*float64(p.jobs))
				require.LessOrEqual(t, r.finish.Seconds(), 1.15*p.floor())
				require.Equal(t, limiter.SourceLearned, r.source)
				require.Equal(t, int(p.capacity), r.final.Burst)
			}
		})
	}

	// The provider changes its limit 3 s into the herd: the learned limit follows.
	for _, tc := range []struct {
		name     string
		capacity float64
		rate     float64
	}{
		{"ProviderRaises", 40, 20},
		{"ProviderLowersRate", 20, 5},
		{"ProviderLowersBoth", 10, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := base
			p.format = anthropicSeconds
			p.changeAt, p.changeCapacity, p.changeRate = 3*time.Second, tc.capacity, tc.rate
			r := runSim(t, p)
			t.Logf("%v", r)
			require.Equal(t, p.jobs, r.succeeded)
			require.LessOrEqual(t, r.rejected, 5)
			require.Equal(t, limiter.SourceLearned, r.source)
			require.Equal(t, int(tc.capacity), r.final.Burst)
			require.InDelta(t, tc.rate, r.final.Rate, 0.15*tc.rate)
			require.LessOrEqual(t, r.final.Rate, tc.rate*1.01)
		})
	}
}
