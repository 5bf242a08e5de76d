package config

import "time"

// Streaming configures the delta buffers of streaming jobs ("stream": true): one Redis Stream
// per job, written by the worker that calls the provider and read by every API replica that
// holds a client's event stream (internal/deltastream).
type Streaming struct {
	// BufferMaxEntries bounds each job's buffer, in entries (trimmed approximately; consecutive
	// pieces of one block written together are one entry). A client that falls further behind,
	// or resumes from further back, gets no more deltas of that attempt (none past the trimmed
	// entries: never a text with a hole); the terminal event still carries the whole result. Default 10000; between 100 and 1000000.
	BufferMaxEntries int64 `yaml:"buffer_max_entries"`
	// BufferTTL is how long a job's buffer outlives its last write: how late a client may open
	// or resume the stream and still catch up on its deltas. Default 10m; between 1s and 24h.
	BufferTTL time.Duration `yaml:"buffer_ttl"`
	// DeltaSpacing spaces the writes of an attempt's pieces to its buffer: a piece the provider
	// sends less than DeltaSpacing after the attempt's last write waits (at most DeltaSpacing)
	// and goes with the pieces sent meanwhile as one entry, so that a fast stream costs Redis,
	// the API replicas and every client about one event per DeltaSpacing instead of one per
	// token. An attempt's first piece, and a piece after a quiet spell, go at once: the time to
	// the first delta does not change. Default 0: each piece goes as soon as it can, so clients
	// see every token as the provider sent it; at most 1s.
	DeltaSpacing time.Duration `yaml:"delta_spacing"`
}

// Defaults and bounds of Streaming.
const (
	DefaultStreamBufferMaxEntries = 10000
	DefaultStreamBufferTTL        = 10 * time.Minute
)

func (s *Streaming) withDefaults() {
	if s.BufferMaxEntries == 0 {
		s.BufferMaxEntries = DefaultStreamBufferMaxEntries
	}
	if s.BufferTTL == 0 {
		s.BufferTTL = DefaultStreamBufferTTL
	}
}

func (s *Streaming) validate(bad func(field, format string, args ...any)) {
	if s.BufferMaxEntries < 100 || s.BufferMaxEntries > 1_000_000 {
		bad("streaming.buffer_max_entries", "must be between 100 and 1000000, got %d", s.BufferMaxEntries)
	}
	if s.BufferTTL < time.Second || s.BufferTTL > 24*time.Hour {
		bad("streaming.buffer_ttl", "must be between 1s and 24h, got %s", s.BufferTTL)
	}
	if s.DeltaSpacing < 0 || s.DeltaSpacing > time.Second {
		bad("streaming.delta_spacing", "must be between 0 and 1s, got %s", s.DeltaSpacing)
	}
}
