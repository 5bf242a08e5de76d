package limiter

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/redisscript"
)

// Priority orders a tenant's waiting attempts on a credential (Lane.Priority).
type Priority int

// The priorities, highest first.
const (
	PriorityHigh Priority = iota
	PriorityNormal
	PriorityLow
)

// Lane names the fair-queueing lane of an attempt (AttemptOptions.Lane): its tenant and
// priority, and its ticket, the attempt's place in that lane.
//
// A credential's slots are shared between the lanes with waiting attempts by weighted fair
// queueing: a tenant's share is its Weight against the other waiting tenants' weights, and
// inside a tenant its highest waiting priority takes the share but for the minimum share
// (Fairness.MinShareNormal, MinShareLow) each lower waiting priority keeps. Inside a lane,
// tickets go in the order of Since.
type Lane struct {
	// Tenant names the tenant (letters, digits, '_', '.', '-'; no '|').
	Tenant string
	// Weight is the tenant's weight, 1..1000; 0 means 1.
	Weight int
	// Priority is the attempt's priority.
	Priority Priority
	// Ticket identifies the waiting attempt (the job ID): asking again with the same ticket keeps
	// its place.
	Ticket string
	// Since orders the tickets of a lane (the job's creation time): a ticket lost with Redis
	// state, or dropped because its holder did not come back in time, takes the same place again
	// when it asks next.
	Since time.Time
}

func (l *Lane) valid() error {
	switch {
	case l.Tenant == "" || strings.Contains(l.Tenant, "|"):
		return fmt.Errorf("lane tenant %q: want a non-empty name without '|'", l.Tenant)
	case l.Weight < 0 || l.Weight > 1000:
		return fmt.Errorf("lane weight %d: want 1..1000", l.Weight)
	case l.Priority < PriorityHigh || l.Priority > PriorityLow:
		return fmt.Errorf("lane priority %d: want PriorityHigh..PriorityLow", l.Priority)
	case l.Ticket == "":
		return fmt.Errorf("lane ticket: want the attempt's job ID")
	}
	return nil
}

// name is the lane's name in Redis: "<tenant>|<priority>".
func (l *Lane) name() string { return l.Tenant + "|" + strconv.Itoa(int(l.Priority)) }

// appendName appends the lane's name to b.
func (l *Lane) appendName(b []byte) []byte {
	return strconv.AppendInt(append(append(b, l.Tenant...), '|'), int64(l.Priority), 10)
}

// Fairness configures the fair queueing of attempts that name a Lane.
type Fairness struct {
	// MinShareNormal is the least share of its tenant's slots that normal work keeps while it
	// waits beside high work. Default 0.1.
	MinShareNormal float64
	// MinShareLow is the least share of its tenant's slots that low work keeps while it waits
	// beside higher work. Default 0.05.
	MinShareLow float64
	// Horizon is how far ahead slots are handed out to attempts with a Lane: an attempt is
	// granted a slot only when its turn (among every lane's waiting tickets) comes within
	// Horizon; it is told to ask again about when it will. A newly arrived attempt of another
	// tenant or a higher priority thus waits about Horizon at most behind slots handed out
	// already. Default 50ms.
	Horizon time.Duration
	// TicketGrace is how long past the time it was told to ask again a waiting ticket is kept
	// for its holder (a worker that died, a job canceled). Its job finds the same place again
	// when it does ask (Lane.Since). When the first ticket of a lane is dropped so, the lane's
	// other tickets go with it (they are likely canceled too); their holders put them back when
	// they ask. Default 5s.
	TicketGrace time.Duration
	// MaxRecheck is the longest a waiting ticket is kept without its holder asking again (plus
	// TicketGrace): a ticket whose turn is further off is told to ask again at half its foreseen
	// wait (so a backlog of N jobs asks about N log N times, spread by place in line, rather
	// than N times every MaxRecheck), is dropped meanwhile, and takes its place again (Since)
	// when it asks; but the first ticket of its lane is kept until its holder comes back, so that
	// the lane keeps its place against the others'. Under a learned limit it is also the longest
	// wait before asking again (at most 1s). Default 30s.
	MaxRecheck time.Duration
}

// Defaults of Fairness.
const (
	DefaultMinShareNormal = 0.1
	DefaultMinShareLow    = 0.05
	DefaultFairHorizon    = 50 * time.Millisecond
	DefaultTicketGrace    = 5 * time.Second
	DefaultMaxRecheck     = 30 * time.Second
)

func (f Fairness) withDefaults() Fairness {
	if f.MinShareNormal == 0 {
		f.MinShareNormal = DefaultMinShareNormal
	}
	if f.MinShareLow == 0 {
		f.MinShareLow = DefaultMinShareLow
	}
	if f.Horizon == 0 {
		f.Horizon = DefaultFairHorizon
	}
	if f.TicketGrace == 0 {
		f.TicketGrace = DefaultTicketGrace
	}
	if f.MaxRecheck == 0 {
		f.MaxRecheck = DefaultMaxRecheck
	}
	return f
}

func (f Fairness) validate() error {
	bad := func(x float64) bool { return math.IsNaN(x) || x <= 0 || x > 0.5 }
	switch {
	case bad(f.MinShareNormal):
		return fmt.Errorf("Fairness.MinShareNormal %v: want above 0, at most 0.5", f.MinShareNormal)
	case bad(f.MinShareLow):
		return fmt.Errorf("Fairness.MinShareLow %v: want above 0, at most 0.5", f.MinShareLow)
	case f.MinShareNormal+f.MinShareLow > 0.9:
		return fmt.Errorf("Fairness.MinShareNormal + MinShareLow %v: want at most 0.9", f.MinShareNormal+f.MinShareLow)
	case f.Horizon < time.Millisecond:
		return fmt.Errorf("Fairness.Horizon %v: want at least 1ms", f.Horizon)
	case f.TicketGrace < 100*time.Millisecond:
		return fmt.Errorf("Fairness.TicketGrace %v: want at least 100ms", f.TicketGrace)
	case f.MaxRecheck < f.Horizon:
		return fmt.Errorf("Fairness.MaxRecheck %v: want at least Fairness.Horizon", f.MaxRecheck)
	}
	return nil
}

// appendFairKeys appends reserveScript's KEYS[6..9] for lane l to keys, the lane's key formatted
// into a; appendFairArgs appends its ARGV[28..40].
func (c *Gate) appendFairKeys(keys []any, a *redisscript.Args, l *Lane) []any {
	k := &c.keys
	return append(keys, k.fair, k.fairLanes, k.fairDeadline, a.End(l.appendName(append(a.Buf(), k.fairLane...))))
}

func (c *Gate) appendFairArgs(args []any, a *redisscript.Args, l *Lane) []any {
	ca := &c.l.args
	return append(args, "1", c.keys.fairLaneArg, a.End(l.appendName(a.Buf())), a.Text(l.Tenant),
		a.Int(int64(l.Priority)), a.Int(int64(max(l.Weight, 1))), a.Text(l.Ticket), a.Int(l.Since.UnixMicro()),
		ca.minShareNormal, ca.minShareLow, ca.fairHorizon, ca.ticketGrace, ca.maxRecheck)
}
