package limiter

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
)

// PauseState is a credential's pause episode.
type PauseState struct {
	// Paused reports whether the credential is paused; the other fields are zero when not.
	Paused bool
	// Since is when the episode began.
	Since time.Time
	// Reason is the reason given by the Pause that began it.
	Reason string
	// FirstJobID is the job whose failure began it.
	FirstJobID string
	// Unknown reports that Redis holds no pause state for the credential at all, neither a
	// pause nor a resume: it lost it (a restart without persistence, a flush), or none was ever
	// written. Paused is false then; a caller that keeps pauses durably (internal/credpause)
	// restores the state with RestorePause.
	Unknown bool
}

// Pause stops the credential until Resume, shared by all processes: the caller checks Paused
// before sending. Use it for a 429 without Retry-After (a spend cap that keeps failing until an
// operator acts). started is true only for the call that began this episode, across all
// processes, so the caller alerts once per episode. A pause does not expire. It returns an error
// only when Redis fails.
func (c *Gate) Pause(ctx context.Context, reason, jobID string) (started bool, err error) {
	n, err := pauseScript.Run(ctx, c.l.rdb, c.pauseKeys(), c.l.nowArg(), reason, jobID).Int()
	if err != nil {
		return false, fmt.Errorf("pause credential: %w", err)
	}
	c.series.setPaused(true)
	return n >= 1, nil
}

// pauseKeys are the KEYS of the pause scripts: the pause hash and its known flag.
func (c *Gate) pauseKeys() []string {
	return []string{pauseKey(c.l.cfg.Prefix, c.tag), pauseKnownKey(c.l.cfg.Prefix, c.tag)}
}

// PauseSince is Pause for an episode kept elsewhere too (internal/credpause): kept (Since,
// Reason, FirstJobID) is the episode as kept, which every caller pausing it gives alike, so that
// Redis holds the same state whichever of them reaches it first. fresh is the episode this call
// would begin: Redis begins it instead of kept when it holds the credential as not paused (a
// resume or a restore of "not paused" since; known reports it), for kept is then an episode that
// a resume in Redis alone ended (the last release's ctl, console and pause probe resumed so). A
// zero fresh begins kept in any case.
func (c *Gate) PauseSince(ctx context.Context, kept, fresh PauseState) (started, known bool, err error) {
	args := []any{strconv.FormatInt(kept.Since.UnixMicro(), 10), kept.Reason, kept.FirstJobID}
	if !fresh.Since.IsZero() {
		args = append(args, strconv.FormatInt(fresh.Since.UnixMicro(), 10), fresh.Reason, fresh.FirstJobID)
	}
	n, err := pauseScript.Run(ctx, c.l.rdb, c.pauseKeys(), args...).Int()
	if err != nil {
		return false, false, fmt.Errorf("pause credential: %w", err)
	}
	c.series.setPaused(true)
	return n >= 1, n == 2, nil
}

// Resume ends the pause episode, if any; the next Pause starts a new one. Redis keeps that the
// credential is not paused (PauseState.Unknown is false after it). It reports whether the
// credential was paused, and returns an error only when Redis fails.
func (c *Gate) Resume(ctx context.Context) (bool, error) {
	n, err := resumeScript.Run(ctx, c.l.rdb, c.pauseKeys()).Int()
	if err != nil {
		return false, fmt.Errorf("resume credential: %w", err)
	}
	c.series.setPaused(false)
	return n == 1, nil
}

// Paused returns the credential's pause state. It returns an error only when Redis fails.
func (c *Gate) Paused(ctx context.Context) (PauseState, error) {
	var (
		hash  *redis.MapStringStringCmd
		known *redis.IntCmd
	)
	// One transaction: the hash and its known flag as one state (both keys are in one slot).
	_, err := c.l.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		hash = p.HGetAll(ctx, pauseKey(c.l.cfg.Prefix, c.tag))
		known = p.Exists(ctx, pauseKnownKey(c.l.cfg.Prefix, c.tag))
		return nil
	})
	if err != nil {
		return PauseState{}, fmt.Errorf("read pause state: %w", err)
	}
	m := hash.Val()
	since, ok := m["since"]
	return c.pauseState(since, ok, m["reason"], m["job"], len(m) == 0 && known.Val() == 0), nil
}

// pauseState is the PauseState of a pause hash read: its since field (ok: present), reason and
// job, and whether neither the hash nor its known flag exists (unknown). It updates the paused
// gauge.
func (c *Gate) pauseState(since string, ok bool, reason, job string, unknown bool) PauseState {
	if !ok {
		c.series.setPaused(false)
		return PauseState{Unknown: unknown}
	}
	us, _ := strconv.ParseInt(since, 10, 64)
	c.series.setPaused(true)
	return PauseState{Paused: true, Since: time.UnixMicro(us), Reason: reason, FirstJobID: job}
}

// NowAndPaused is Now and Paused in one round trip: the limiter's clock and the credential's
// pause state, read together. A delivery of a slot held in a job row needs both (the slot's
// time is on the limiter's clock, and a held slot does not go on a paused credential); under a
// rate-limit backlog most deliveries are such. It returns an error only when Redis fails.
func (c *Gate) NowAndPaused(ctx context.Context) (time.Time, PauseState, error) {
	res, err := clockPauseScript.Run(ctx, c.l.rdb, c.pauseKeys(), c.l.nowArg()).Slice()
	if err != nil {
		return time.Time{}, PauseState{}, fmt.Errorf("read the limiter's clock and pause state: %w", err)
	}
	if len(res) != 5 {
		return time.Time{}, PauseState{}, fmt.Errorf("read the limiter's clock and pause state: unexpected reply %v", res)
	}
	since, ok := res[1].(string)
	ps := c.pauseState(since, ok, redisscript.String(res[2]), redisscript.String(res[3]), redisscript.Int(res[4]) == 0)
	return time.UnixMicro(redisscript.Int(res[0])), ps, nil
}

// RestorePause writes ps, a pause state kept elsewhere (ps.Paused false: not paused), into Redis
// when Redis holds none for the credential (PauseState.Unknown); a state Redis holds, a pause or
// a resume made since ps was read, is left as it is. It reports whether it wrote ps, and returns
// an error only when Redis fails.
func (c *Gate) RestorePause(ctx context.Context, ps PauseState) (bool, error) {
	since := ""
	if ps.Paused {
		since = strconv.FormatInt(ps.Since.UnixMicro(), 10)
	}
	n, err := restorePauseScript.Run(ctx, c.l.rdb, c.pauseKeys(), since, ps.Reason, ps.FirstJobID).Int()
	if err != nil {
		return false, fmt.Errorf("restore pause state: %w", err)
	}
	if n == 1 {
		c.series.setPaused(ps.Paused)
	}
	return n == 1, nil
}

// RestoreLostPause writes ps, a pause episode kept elsewhere (internal/credpause), into Redis
// when Redis holds the credential as not paused although that episode never ended there: Redis
// lost it in a failover (its replica had the state from before the pause; keys written in the
// last moments are gone), or the pause never reached Redis. An episode that Redis held and a
// resume there alone ended (the last release's ctl, console or pause probe) stays ended, and a
// pause Redis holds stays. Unlike RestorePause it may replace a resume Redis holds: call it
// only while holding the credential's pause lock, with ps read under it, so that no resume ends
// the episode between the read and the write. It reports whether it wrote ps, and returns an
// error only when Redis fails.
func (c *Gate) RestoreLostPause(ctx context.Context, ps PauseState) (bool, error) {
	if !ps.Paused {
		return false, nil
	}
	n, err := restoreLostPauseScript.Run(ctx, c.l.rdb, c.pauseKeys(), strconv.FormatInt(ps.Since.UnixMicro(), 10),
		ps.Reason, ps.FirstJobID).Int()
	if err != nil {
		return false, fmt.Errorf("restore lost pause: %w", err)
	}
	if n == 1 {
		c.series.setPaused(true)
	}
	return n == 1, nil
}

// PauseProbe is an automatic probe of a paused credential that TryProbe granted; the zero
// PauseProbe is none.
type PauseProbe struct {
	grant string // the probe's time as the pause hash holds it (µs)
}

// Granted reports whether p is a probe the caller may send.
func (p PauseProbe) Granted() bool { return p.grant != "" }

// TryProbe grants the caller one automatic probe request on the paused credential: at most one
// caller per every, across all processes, the first one every after the pause began. It
// returns the zero PauseProbe when the credential is not paused or the interval's probe is
// taken. The caller Resumes when the probe succeeds, and ReleaseProbe when it does not send it.
// It returns an error only when Redis fails.
func (c *Gate) TryProbe(ctx context.Context, every time.Duration) (PauseProbe, error) {
	return c.probeAnswer(ctx, probeScript, "try pause probe", c.l.nowArg(), micros(every))
}

// probeAnswer runs script, which answers a probe's grant (a string) or 0, on the pause hash with
// args, and returns the probe it grants (zero: none). what names the call in its error.
func (c *Gate) probeAnswer(ctx context.Context, script *redis.Script, what string, args ...any) (PauseProbe, error) {
	v, err := script.Run(ctx, c.l.rdb, []string{pauseKey(c.l.cfg.Prefix, c.tag)}, args...).Result()
	if err != nil {
		return PauseProbe{}, fmt.Errorf("%s: %w", what, err)
	}
	s, ok := v.(string)
	if !ok {
		return PauseProbe{}, nil
	}
	return PauseProbe{grant: s}, nil
}

// onProbe runs script on the pause hash with p's grant and args, when p is granted (a zero p
// changes nothing). what names the call in its error.
func (c *Gate) onProbe(ctx context.Context, p PauseProbe, script *redis.Script, what string, args ...any) error {
	if !p.Granted() {
		return nil
	}
	if err := script.Run(ctx, c.l.rdb, []string{pauseKey(c.l.cfg.Prefix, c.tag)}, append([]any{p.grant}, args...)...).Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// ReleaseProbe gives back probe p, granted by TryProbe, when its request will not be sent (its
// job was canceled, deferred or failed before the call): the credential's next probe may then go
// at once rather than an interval later. A probe already released, or one whose pause has ended
// since, is left alone, as is a zero p. It returns an error only when Redis fails.
func (c *Gate) ReleaseProbe(ctx context.Context, p PauseProbe) error {
	return c.onProbe(ctx, p, releaseProbeScript, "release pause probe")
}

// HoldProbe marks probe p, granted by TryProbe, as held by job jobID, whose request waits for a
// slot held in its row (its send time too far off to wait for in the delivery): the delivery
// that comes back for the slot takes p again with ReclaimProbe, where TryProbe refuses it (the
// interval's probe is p). A p no longer the pause's probe (released, or its pause ended) is not
// marked, nor is a zero p. It returns an error only when Redis fails.
func (c *Gate) HoldProbe(ctx context.Context, p PauseProbe, jobID string) error {
	return c.onProbe(ctx, p, holdProbeScript, "hold pause probe", jobID)
}

// ReclaimProbe returns the pause's probe when job jobID holds it (HoldProbe), once; else the zero
// PauseProbe. It returns an error only when Redis fails.
func (c *Gate) ReclaimProbe(ctx context.Context, jobID string) (PauseProbe, error) {
	return c.probeAnswer(ctx, reclaimProbeScript, "reclaim pause probe", jobID)
}

// ReleaseHeldProbe gives back the pause's probe when job jobID holds it (HoldProbe) and will not
// send it: its job left the credential, or ended, with the probe's slot still held in its row.
// The next probe may then go at once rather than an interval later, as after ReleaseProbe. A job
// holding none changes nothing. It returns an error only when Redis fails.
func (c *Gate) ReleaseHeldProbe(ctx context.Context, jobID string) error {
	if err := releaseHeldProbeScript.Run(ctx, c.l.rdb, []string{pauseKey(c.l.cfg.Prefix, c.tag)}, jobID).Err(); err != nil {
		return fmt.Errorf("release held pause probe: %w", err)
	}
	return nil
}
