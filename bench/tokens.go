package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
)

// tokensBench is `bench tokens`: n long prompts submitted at once against input- and
// output-token limits, at llmq counting requests only, with the token limits configured, and
// with them learned from the provider's headers.
type tokensBench struct {
	s           *shared
	inputTokens int // per job: the prompt is 4 × inputTokens bytes of text
	maxTokens   int // per job: max_tokens
	replyTokens int // the simulator's reply length in tokens
	inputTPM    int
	outputTPM   int
	tokenMinute time.Duration
	latency     time.Duration
	results     []result
}

// tokensRows are the rows of the tokens table. The token targets judge two of them: with the
// token limits configured, the floor within 5 % and no 429; with them learned, the floor within
// 15 % and at most 1.1 requests per success.
func (t *tokensBench) rows() []burstRow {
	requestsOnly := llmqSetup{limits: &config.Limits{RequestsPerSecond: t.s.rate, Burst: int(t.s.capacity)}, tokenMinute: t.tokenMinute}
	known := llmqSetup{limits: &config.Limits{RequestsPerSecond: t.s.rate, Burst: int(t.s.capacity),
		InputTokensPerMinute: float64(t.inputTPM), OutputTokensPerMinute: float64(t.outputTPM)}, tokenMinute: t.tokenMinute}
	return []burstRow{
		{id: "llmq-requests", name: "llmq, request limit only", wrap: hideTokenHeaders, run: llmqRow(requestsOnly)},
		{id: "llmq-known", name: "llmq, token limits known", target: &target{maxRatio: 1.05, no429: true}, run: llmqRow(known)},
		{id: "llmq-learned", name: "llmq, token limits learned", target: &target{maxRatio: 1.15, maxPerSuccess: 1.1},
			run: llmqRow(requestsOnly)},
	}
}

func (t *tokensBench) flags(fs *flagSet, s *shared) {
	t.s = s
	s.base(fs, 4)
	s.redis(fs)
	s.jobs(fs, 100, "jobs submitted at once")
	s.bucket(fs, 50, 50)
	s.deadline(fs, 3*time.Minute, "cap on each row, from its first submit")
	s.rows(fs, rowIDs(t.rows()))
	fs.intAtLeast(&t.inputTokens, "input-tokens", 2000, 1, "input tokens per job (the prompt is 4 bytes of text per token)")
	fs.intAtLeast(&t.maxTokens, "max-tokens", 200, 1, "max_tokens per job")
	fs.intAtLeast(&t.replyTokens, "reply-tokens", 150, 1, "output tokens of every reply (the simulator's ReplyTokens)")
	fs.IntVar(&t.inputTPM, "input-tpm", 40000, "the credential's input tokens per (token) minute")
	fs.IntVar(&t.outputTPM, "output-tpm", 8000, "the credential's output tokens per (token) minute")
	fs.durationAtLeast(&t.tokenMinute, "token-minute", 6*time.Second, time.Second,
		"length of the token \"minute\" in the simulator and llmq's worker.token_minute (1m is real time)")
	fs.durationAtLeast(&t.latency, "latency", 0, 0, "the simulator's answer latency")
	fs.check(func() error {
		switch {
		case t.inputTPM < t.inputTokens:
			return errors.New("-input-tpm: must be at least -input-tokens (else every request is refused 400)")
		case t.outputTPM < t.maxTokens:
			return errors.New("-output-tpm: must be at least -max-tokens (else every request is refused 400)")
		}
		return nil
	})
}

// replyTokensPerJob is the output tokens one successful answer carries (and is charged): the
// simulator's reply length, cut at max_tokens.
func (t *tokensBench) replyTokensPerJob() int { return min(t.replyTokens, t.maxTokens) }

// floorBucket is one of the provider's buckets and what a run charges it.
type floorBucket struct {
	name     string
	charged  float64 // the total the run charges
	capacity float64 // what the bucket holds when full (it starts full)
	rate     float64 // its refill per second
}

// time is how long the bucket needs to admit everything charged: what it holds at once, the
// rest at its refill rate; 0 when it holds everything.
func (b floorBucket) time() time.Duration {
	return time.Duration(math.Max(0, b.charged-b.capacity) / b.rate * float64(time.Second))
}

// buckets are the simulator's buckets with what the n jobs are charged in each: a request each,
// inputTokens each, and the reply's output tokens each (the output reservation of max_tokens
// is trued down to the reply when the answer is decided).
func (t *tokensBench) buckets() []floorBucket {
	n, minute := float64(t.s.n), t.tokenMinute.Seconds()
	return []floorBucket{
		{name: "requests", charged: n, capacity: t.s.capacity, rate: t.s.rate},
		{name: "input tokens", charged: n * float64(t.inputTokens), capacity: float64(t.inputTPM), rate: float64(t.inputTPM) / minute},
		{name: "output tokens", charged: n * float64(t.replyTokensPerJob()), capacity: float64(t.outputTPM), rate: float64(t.outputTPM) / minute},
	}
}

// floor is the binding bucket's time (the longest) and that bucket.
func (t *tokensBench) floor() (time.Duration, floorBucket) {
	var binding floorBucket
	var floor time.Duration
	for i, b := range t.buckets() {
		if d := b.time(); i == 0 || d > floor {
			floor, binding = d, b
		}
	}
	return floor, binding
}

func (t *tokensBench) run(ctx context.Context, log logf) error {
	rows, err := selectRows(t.rows(), t.s.only)
	if err != nil {
		return err
	}
	if err := t.s.binaries(ctx, log); err != nil {
		return err
	}
	floor, binding := t.floor()
	log("%d jobs of %d input tokens and max_tokens %d at once; floor %s (%s); %d rows", t.s.n, t.inputTokens, t.maxTokens,
		seconds(floor), binding.name, len(rows))
	b := burst{shared: t.s, body: func(i int) []byte { return tokensBody(i, t.inputTokens, t.maxTokens) },
		sim: llmsim.Config{Capacity: t.s.capacity, RefillPerSecond: t.s.rate, InputTokensPerMinute: t.inputTPM,
			OutputTokensPerMinute: t.outputTPM, TokenMinute: t.tokenMinute, ReplyTokens: t.replyTokens, Latency: t.latency}}
	t.results = b.runRows(ctx, log, rows)
	return nil
}

func (t *tokensBench) report() report {
	s := t.s
	floor, binding := t.floor()
	j := targetJudge(floor)
	rows := make([][]string, len(t.results))
	for i, r := range t.results {
		rows[i] = burstCells(r, floor, j)
	}
	var parts []string
	for _, b := range t.buckets() {
		parts = append(parts, fmt.Sprintf("%s %s", b.name, seconds(b.time())))
	}
	notes := []string{
		fmt.Sprintf("%d jobs at once, each %s input tokens (%s bytes) and max_tokens %d; replies of %d tokens. Limits: %g requests/s "+
			"(burst %g), %s input and %s output tokens per %s (the token minute, scaled down); %d llmq workers; simulator latency %s.",
			s.n, thousands(t.inputTokens), thousands(4*t.inputTokens), t.maxTokens, t.replyTokens, s.rate, s.capacity,
			thousands(t.inputTPM), thousands(t.outputTPM), t.tokenMinute, s.workers, t.latency),
		fmt.Sprintf("Floor = the longest of the buckets' max(0, charged − capacity) / refill: %s; floor %s (%s).",
			strings.Join(parts, ", "), seconds(floor), binding.name),
	}
	judged, failed := burstNotes(t.results, j)
	notes = append(notes, judged...)
	wantIn, wantOut := s.n*t.inputTokens, s.n*t.replyTokensPerJob()
	for _, r := range t.results {
		if r.err == nil && (r.stats.InputTokens != wantIn || r.stats.OutputTokens != wantOut) {
			notes = append(notes, fmt.Sprintf("%s: the simulator charged %s input and %s output tokens, not the floor's %s and %s.",
				r.name, thousands(r.stats.InputTokens), thousands(r.stats.OutputTokens), thousands(wantIn), thousands(wantOut)))
		}
	}
	return report{tables: []table{{burstHeader, rows}}, notes: notes, failed: failed}
}

// tokensFiller pads the prompts.
const tokensFiller = "The quick brown fox jumps over the lazy dog. "

// tokensBody is job i's Anthropic Messages request: one user message of exactly
// 4 × inputTokens bytes of ASCII text (inputTokens by the simulator's rule, bytes / 4) that
// starts with the job's number, and max_tokens maxTokens.
func tokensBody(i, inputTokens, maxTokens int) []byte {
	size := 4 * inputTokens
	var b strings.Builder
	b.Grow(size + len(tokensFiller))
	fmt.Fprintf(&b, "tokens request %d: ", i)
	for b.Len() < size {
		b.WriteString(tokensFiller)
	}
	return fmt.Appendf(nil, `{"model":"claude-bench","max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, maxTokens, b.String()[:size])
}
