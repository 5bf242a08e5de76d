package config

import "time"

// Batch configures a credential's batch lane: jobs submitted with "lane": "batch" (or "auto",
// when their deadline leaves room for Window) go through the provider's batch API (Anthropic
// Message Batches, OpenAI Batch) at the providers' batch price, half the online one.
type Batch struct {
	// Enabled lets jobs use the credential's batch lane. Default false: "batch" is refused at
	// submit and "auto" stays online.
	Enabled bool `yaml:"enabled"`
	// MaxRequestsPerBatch is the most jobs one provider batch holds; a full batch is sent at
	// once. Default 1000; at most 50,000 (OpenAI's limit; Anthropic's is 100,000).
	MaxRequestsPerBatch int `yaml:"max_requests_per_batch"`
	// MaxWaitToFill is the longest the oldest waiting job waits for its batch to fill before the
	// batch is sent as it is. Default 1m; at most Window.
	MaxWaitToFill time.Duration `yaml:"max_wait_to_fill"`
	// PollInterval is the wait before the first poll of a sent batch's state; each poll that
	// finds it still running doubles the wait, up to 10 × PollInterval. Default 30s; at most
	// Window.
	PollInterval time.Duration `yaml:"poll_interval"`
	// Window is how long the provider may take to end a batch (both providers promise 24 h, most
	// end far sooner). "auto" takes the batch lane only when the job's deadline is at least
	// Window away. Default 24h.
	Window time.Duration `yaml:"window"`
	// OnlineFallback is the time before a job's deadline at which a job whose batch has not
	// ended goes back to the online lane, so that the deadline holds whatever the batch does
	// (the provider may then still charge for its batch request). Default 10m; less than Window.
	OnlineFallback time.Duration `yaml:"online_fallback"`
}

// Batch defaults.
const (
	DefaultBatchMaxRequests    = 1000
	DefaultBatchMaxWaitToFill  = time.Minute
	DefaultBatchPollInterval   = 30 * time.Second
	DefaultBatchWindow         = 24 * time.Hour
	DefaultBatchOnlineFallback = 10 * time.Minute
	maxBatchRequests           = 50000
	maxBatchWindow             = 24 * time.Hour
)

func (b *Batch) withDefaults() {
	if b.MaxRequestsPerBatch == 0 {
		b.MaxRequestsPerBatch = DefaultBatchMaxRequests
	}
	b.MaxWaitToFill = orDuration(b.MaxWaitToFill, DefaultBatchMaxWaitToFill)
	b.PollInterval = orDuration(b.PollInterval, DefaultBatchPollInterval)
	b.Window = orDuration(b.Window, DefaultBatchWindow)
	b.OnlineFallback = orDuration(b.OnlineFallback, DefaultBatchOnlineFallback)
}

// validate reports each bad field of the batch block at f (credentials[i].batch).
func (b *Batch) validate(f string, bad func(field, format string, args ...any)) {
	if b.MaxRequestsPerBatch < 1 || b.MaxRequestsPerBatch > maxBatchRequests {
		bad(f+".max_requests_per_batch", "must be between 1 and %d (got %d)", maxBatchRequests, b.MaxRequestsPerBatch)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"max_wait_to_fill", b.MaxWaitToFill}, {"poll_interval", b.PollInterval}, {"window", b.Window}, {"online_fallback", b.OnlineFallback}} {
		if d.v < time.Millisecond {
			bad(f+"."+d.name, "must be a positive duration of at least 1ms (got %s)", d.v)
		}
	}
	if b.Window > maxBatchWindow {
		bad(f+".window", "must be at most %s, the providers' batch window (got %s)", maxBatchWindow, b.Window)
	}
	// Longer than the window, they are the window: a batch has ended (or its jobs gone online)
	// by then. Far longer, the poll's backoff (up to 10 × poll_interval) would overflow.
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"max_wait_to_fill", b.MaxWaitToFill}, {"poll_interval", b.PollInterval}} {
		if d.v > b.Window {
			bad(f+"."+d.name, "must be at most %s.window (%s), got %s", f, b.Window, d.v)
		}
	}
	if b.OnlineFallback >= b.Window {
		// A job given the window as its timeout would be past its fallback when submitted:
		// every batch-lane job would go online at once.
		bad(f+".online_fallback", "must be less than %s.window (%s), got %s", f, b.Window, b.OnlineFallback)
	}
}

// AutoBatch reports whether a job of timeout may take the batch lane when submitted with "auto":
// batches are enabled and its timeout is at least the window (the online fallback is not added).
func (b Batch) AutoBatch(timeout time.Duration) bool {
	return b.Enabled && timeout >= b.Window
}
