package llmsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// DefaultBadRequestMarker is the marker used when Faults.BadRequestMarker is
// empty.
const DefaultBadRequestMarker = "LLMSIM_BAD_REQUEST"

// Faults are the injected failure modes. The zero value injects nothing.
// They can be set at start (Config.Faults), with [Server.SetFaults] and with
// POST /_sim/faults; each replaces all of them. The JSON form uses snake_case
// names, Go duration strings ("250ms", "1m") and RFC 3339 times.
type Faults struct {
	// SpendCap answers every request 429 with no retry-after header and the
	// provider's spend-cap body: Anthropic rate_limit_error with
	// error.details.error_code "enforced_spend_limit_reached"; OpenAI
	// insufficient_quota (type and code). Takes no token.
	SpendCap bool
	// OverloadedUntil answers requests overloaded until this time (by
	// Config.Now): Anthropic 529 overloaded_error, OpenAI 503 server_error
	// (OpenAI has no 529).
	OverloadedUntil time.Time
	// OverloadedFor sets OverloadedUntil to now+OverloadedFor when the faults
	// are applied (at New, SetFaults or Reset). Afterwards the stored faults
	// carry the resulting OverloadedUntil and a zero OverloadedFor.
	OverloadedFor time.Duration
	// ErrorRate is the fraction of requests, in [0, 1], answered with
	// ErrorStatus.
	ErrorRate float64
	// ErrorStatus is the status of ErrorRate's errors, 400-599. Default 500.
	ErrorStatus int
	// FailNext makes the next FailNext requests that reach the fault checks
	// answer FailNextStatus; it counts down by exactly one per such request.
	FailNext int
	// FailNextStatus is the status of FailNext's errors, 400-599. Default 500.
	FailNextStatus int
	// RetryAfter is the retry-after sent with injected errors (overload,
	// FailNext, ErrorRate), rounded up to whole seconds. When zero, injected
	// 429s carry "retry-after: 1" and other statuses none.
	RetryAfter time.Duration
	// BadRequestMarker makes a request whose body contains it answer 400
	// invalid_request_error. Default [DefaultBadRequestMarker].
	BadRequestMarker string
	// Hang accepts requests and never answers until the client gives up.
	Hang bool
	// SlowFirstByte sends the status and headers at once, flushes, waits this
	// long, then sends the body: it delays time to first body byte only.
	SlowFirstByte time.Duration
	// StreamFailNext makes the next StreamFailNext streaming requests that would succeed fail
	// part-way through their stream, after StreamFailAfter tokens, the way StreamFailMode says;
	// it counts down by one per such request. Non-streaming requests are not affected.
	StreamFailNext int
	// StreamFailAfter is how many content tokens a failing stream sends first. Default 0: the
	// failure follows the stream's opening events.
	StreamFailAfter int
	// StreamFailMode is how a stream fails: [StreamFailError] (the default), [StreamFailCut] or
	// [StreamFailStall].
	StreamFailMode string
}

// The ways a stream fails (Faults.StreamFailMode).
const (
	// StreamFailError sends the provider's mid-stream error: Anthropic an "error" event with
	// overloaded_error, OpenAI a data chunk {"error":{...,"type":"server_error"}}; then the
	// stream ends.
	StreamFailError = "error"
	// StreamFailCut drops the connection without ending the stream.
	StreamFailCut = "cut"
	// StreamFailStall stops sending and holds the connection until the client gives up.
	StreamFailStall = "stall"
)

func (f Faults) validate() error {
	switch {
	case f.ErrorRate < 0 || f.ErrorRate > 1:
		return errors.New("error_rate: must be between 0 and 1")
	case f.ErrorStatus != 0 && (f.ErrorStatus < 400 || f.ErrorStatus > 599):
		return errors.New("error_status: must be 400-599")
	case f.FailNext < 0:
		return errors.New("fail_next: must not be negative")
	case f.FailNextStatus != 0 && (f.FailNextStatus < 400 || f.FailNextStatus > 599):
		return errors.New("fail_next_status: must be 400-599")
	case f.OverloadedFor < 0:
		return errors.New("overloaded_for: must not be negative")
	case f.RetryAfter < 0:
		return errors.New("retry_after: must not be negative")
	case f.SlowFirstByte < 0:
		return errors.New("slow_first_byte: must not be negative")
	case f.StreamFailNext < 0:
		return errors.New("stream_fail_next: must not be negative")
	case f.StreamFailAfter < 0:
		return errors.New("stream_fail_after: must not be negative")
	case f.StreamFailMode != "" && f.StreamFailMode != StreamFailError && f.StreamFailMode != StreamFailCut && f.StreamFailMode != StreamFailStall:
		return errors.New("stream_fail_mode: must be error, cut or stall")
	}
	return nil
}

// resolve fills the defaults and turns OverloadedFor into OverloadedUntil.
func (f Faults) resolve(now time.Time) Faults {
	if f.ErrorStatus == 0 {
		f.ErrorStatus = http.StatusInternalServerError
	}
	if f.FailNextStatus == 0 {
		f.FailNextStatus = http.StatusInternalServerError
	}
	if f.BadRequestMarker == "" {
		f.BadRequestMarker = DefaultBadRequestMarker
	}
	if f.StreamFailMode == "" {
		f.StreamFailMode = StreamFailError
	}
	if f.OverloadedFor > 0 {
		if until := now.Add(f.OverloadedFor); until.After(f.OverloadedUntil) {
			f.OverloadedUntil = until
		}
		f.OverloadedFor = 0
	}
	return f
}

// faultsJSON is the wire form of Faults.
type faultsJSON struct {
	SpendCap         bool       `json:"spend_cap"`
	OverloadedUntil  *time.Time `json:"overloaded_until,omitempty"`
	OverloadedFor    string     `json:"overloaded_for,omitempty"`
	ErrorRate        float64    `json:"error_rate"`
	ErrorStatus      int        `json:"error_status,omitempty"`
	FailNext         int        `json:"fail_next"`
	FailNextStatus   int        `json:"fail_next_status,omitempty"`
	RetryAfter       string     `json:"retry_after,omitempty"`
	BadRequestMarker string     `json:"bad_request_marker,omitempty"`
	Hang             bool       `json:"hang"`
	SlowFirstByte    string     `json:"slow_first_byte,omitempty"`
	StreamFailNext   int        `json:"stream_fail_next,omitempty"`
	StreamFailAfter  int        `json:"stream_fail_after,omitempty"`
	StreamFailMode   string     `json:"stream_fail_mode,omitempty"`
}

// MarshalJSON encodes f in the snake_case wire form.
func (f Faults) MarshalJSON() ([]byte, error) {
	w := faultsJSON{
		SpendCap:         f.SpendCap,
		ErrorRate:        f.ErrorRate,
		ErrorStatus:      f.ErrorStatus,
		FailNext:         f.FailNext,
		FailNextStatus:   f.FailNextStatus,
		BadRequestMarker: f.BadRequestMarker,
		Hang:             f.Hang,
		OverloadedFor:    durationString(f.OverloadedFor),
		RetryAfter:       durationString(f.RetryAfter),
		SlowFirstByte:    durationString(f.SlowFirstByte),
		StreamFailNext:   f.StreamFailNext,
		StreamFailAfter:  f.StreamFailAfter,
		StreamFailMode:   f.StreamFailMode,
	}
	if !f.OverloadedUntil.IsZero() {
		t := f.OverloadedUntil.UTC()
		w.OverloadedUntil = &t
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes the snake_case wire form. Unknown fields and
// malformed durations are errors; values are not range-checked here.
func (f *Faults) UnmarshalJSON(data []byte) error {
	var w faultsJSON
	if err := strictUnmarshal(data, &w); err != nil {
		return err
	}
	out := Faults{
		SpendCap:         w.SpendCap,
		ErrorRate:        w.ErrorRate,
		ErrorStatus:      w.ErrorStatus,
		FailNext:         w.FailNext,
		FailNextStatus:   w.FailNextStatus,
		BadRequestMarker: w.BadRequestMarker,
		Hang:             w.Hang,
		StreamFailNext:   w.StreamFailNext,
		StreamFailAfter:  w.StreamFailAfter,
		StreamFailMode:   w.StreamFailMode,
	}
	if w.OverloadedUntil != nil {
		out.OverloadedUntil = *w.OverloadedUntil
	}
	for _, d := range []struct {
		name string
		in   string
		out  *time.Duration
	}{
		{"overloaded_for", w.OverloadedFor, &out.OverloadedFor},
		{"retry_after", w.RetryAfter, &out.RetryAfter},
		{"slow_first_byte", w.SlowFirstByte, &out.SlowFirstByte},
	} {
		if d.in == "" {
			continue
		}
		v, err := time.ParseDuration(d.in)
		if err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
		*d.out = v
	}
	*f = out
	return nil
}

func durationString(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}
