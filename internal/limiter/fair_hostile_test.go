package limiter_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/tokens"
)

// TestFair_LoneHeavyJobsPayTheirShare: on a credential whose input tokens bind (as in
// TestFair_TokensShareLikeRequests), B has a backlog of small prompts and A sends prompts ten
// times larger, one at a time (a client that submits its next job once the last is sent). A's
// lane empties after each grant; it must not come back free of what its last request took: A
// gets at most half of the input tokens (+ 5%) in every 20 s window (it took 0.84 of them in the
// first), and some in each.
func TestFair_LoneHeavyJobsPayTheirShare(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	s.limit = limiter.Limit{Rate: 10, Burst: 20, InputTokensPerMinute: 60000}
	s.costs = map[string]tokens.Cost{"A": {InputTokens: 1000}, "B": {InputTokens: 100}}
	s.add("B", 1, limiter.PriorityNormal, 3000, 0)
	s.add("A", 1, limiter.PriorityNormal, 1, time.Millisecond)
	s.onGrant = func(a *simAttempt) {
		if a.lane.Tenant == "A" {
			s.add("A", 1, limiter.PriorityNormal, 1, a.send.Sub(t0)+100*time.Millisecond)
		}
	}
	s.run(t0.Add(121 * time.Second))
	require.NotEmpty(t, s.all)
	shares := make([]float64, 6)
	for w := range shares {
		from := t0.Add(time.Second + time.Duration(w)*20*time.Second)
		n := s.sends(from, from.Add(20*time.Second))
		a, b := 1000*n["A"], 100*n["B"]
		shares[w] = float64(a) / float64(a+b)
		t.Logf("window %d: A %d (%d tokens), B %d (%d tokens): A's token share %.3f", w, n["A"], a, n["B"], b, shares[w])
	}
	for w, share := range shares {
		require.LessOrEqual(t, share, 0.55, "window %d: A's token share", w)
		require.Greater(t, share, 0.0, "window %d: A's jobs starved", w)
	}
}

// TestFair_LargePromptKeepsItsTurn: on a credential whose input tokens bind (10 requests/s, 1,000
// input tokens a second; B's backlog of 200-token prompts alone would take 2,000 a second), B's
// backlog was created first and A then submits one prompt ten times larger. A's turn comes at
// once (its lane has used nothing), but the token buckets refuse a slot they push beyond the
// token horizon while another is pending; B's asks behind A's turn then took the refilled tokens
// a few at a time and A's job was never granted while B's backlog lasted. A's job goes within
// 5 s of its arrival (3.2 s: two seconds of refill for its tokens, and the slots already handed
// out): the tokens it waits for are not handed to the turns after it.
func TestFair_LargePromptKeepsItsTurn(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	s.limit = limiter.Limit{Rate: 10, Burst: 20, InputTokensPerMinute: 60000}
	s.costs = map[string]tokens.Cost{"A": {InputTokens: 2000}, "B": {InputTokens: 200}}
	s.add("B", 1, limiter.PriorityNormal, 2000, 0)
	a := s.add("A", 1, limiter.PriorityNormal, 1, 70*time.Second)[0]
	s.run(t0.Add(100 * time.Second))
	require.True(t, a.granted, "A's job starved behind B's small prompts (asked %d times in 30 s)", a.asks)
	require.Less(t, a.send.Sub(a.arrive), 5*time.Second, "A's job waited %v", a.send.Sub(a.arrive))
}

// TestFair_CanceledBacklogLeavesTheLine: A's 3,000 jobs take their tickets and are then canceled
// all at once (or pass their deadlines), so that their holders never ask again. Each ticket
// stayed until its own deadline, up to MaxRecheck + TicketGrace (35 s), ranked before B's asks as
// A's share: once B's lane had passed them in virtual time, B's backlog sent nothing from 11 s to
// 31 s and 55 and 76 of 100 in the next windows. A lane whose first ticket is overdue (its turn
// plus TicketGrace) is dropped whole: B sends 138 from 11 s to 31 s (its asks told to come back
// late while A's tickets stood ahead leave some slots unused), then at the rate (97 of 100).
func TestFair_CanceledBacklogLeavesTheLine(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	as := s.add("A", 1, limiter.PriorityNormal, 3000, 0)
	s.add("B", 1, limiter.PriorityNormal, 2000, 500*time.Millisecond)
	s.run(t0.Add(time.Second))
	for _, a := range as {
		if !a.granted {
			// canceled: never asks again, counted in no window
			a.granted, a.send = true, t0.Add(-time.Hour)
		}
	}
	s.run(t0.Add(61 * time.Second))
	n := make([]int, 6)
	for w := range n {
		from := t0.Add(time.Second + time.Duration(w)*10*time.Second)
		n[w] = s.sends(from, from.Add(10*time.Second))["B"]
		t.Logf("window %d: B %d", w, n[w])
	}
	require.GreaterOrEqual(t, n[1]+n[2], 120, "B's sends from 11 s to 31 s")
	for w := 3; w < len(n); w++ {
		require.GreaterOrEqual(t, n[w], 97, "window %d: B's sends", w)
	}
}

// TestFair_CanceledLargePromptFreesTheTokens: as in TestFair_LargePromptKeepsItsTurn, A's large
// prompt has its turn and the tokens refuse it, so the asks after its turn are held for it; A's
// job is then canceled (or passes its deadline, or its worker dies) and never asks again. The
// tokens it was refused were kept for it until its ticket's deadline (TicketGrace and a second
// after its last ask): no ask of B's that charges a token was granted for 6 s. A block whose
// holder does not come back within a second of the time it was told is void: B sends at the
// tokens' rate again (5 a second) within about a second of A's missed ask.
func TestFair_CanceledLargePromptFreesTheTokens(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	s.limit = limiter.Limit{Rate: 10, Burst: 20, InputTokensPerMinute: 60000}
	s.costs = map[string]tokens.Cost{"A": {InputTokens: 2000}, "B": {InputTokens: 200}}
	s.add("B", 1, limiter.PriorityNormal, 800, 0)
	a := s.add("A", 1, limiter.PriorityNormal, 1, 70*time.Second)[0]
	s.run(t0.Add(70*time.Second + 100*time.Millisecond))
	require.False(t, a.granted, "A's large prompt was granted at once: no block to test")
	require.GreaterOrEqual(t, a.asks, 1)
	// canceled: never asks again, counted in no window
	a.granted, a.send = true, t0.Add(-time.Hour)
	s.run(t0.Add(80 * time.Second))
	n := s.sends(t0.Add(72*time.Second), t0.Add(76*time.Second))["B"]
	t.Logf("B's sends from 72 s to 76 s: %d", n)
	require.GreaterOrEqual(t, n, 15, "B's sends from 72 s to 76 s, after A's large prompt was canceled")
}
