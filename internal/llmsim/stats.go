package llmsim

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
)

// StatusClientClosed is the status recorded for a request whose client went
// away before it was answered (nginx's convention). It is never sent.
const StatusClientClosed = 499

// Stats counts answered provider requests since start or the last Reset.
// Control requests (/_sim/...) are not counted. JSON maps keyed by status use
// the status as a string ("200").
type Stats struct {
	// Requests is the number of answered requests (the sum of ByStatus).
	Requests int `json:"requests"`
	// InFlight is the number of requests being handled now. Reset does not
	// change it.
	InFlight int `json:"in_flight"`
	// ByStatus counts answers by HTTP status; requests abandoned by their
	// client count under [StatusClientClosed].
	ByStatus map[int]int `json:"by_status"`
	// ByKey counts answers per API key, by [KeyID]. Requests without a key
	// are not in it.
	ByKey map[string]KeyStats `json:"by_key"`
	// InputTokens is the total of input tokens charged to token buckets: the
	// input tokens of every request admitted past the buckets (including
	// those that then fail). Zero when no token limit is configured.
	InputTokens int `json:"input_tokens"`
	// OutputTokens is the total of output tokens charged: the usage of every
	// successful answer. Zero when no token limit is configured.
	OutputTokens int `json:"output_tokens"`
}

// KeyStats counts one API key's answered requests.
type KeyStats struct {
	// Requests is the number of answered requests with this key.
	Requests int `json:"requests"`
	// ByStatus counts them by HTTP status.
	ByStatus map[int]int `json:"by_status"`
	// InputTokens and OutputTokens are this key's share of the totals of the
	// same name in [Stats].
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// KeyID names an API key without revealing it: "key-" followed by the first
// 12 hex digits of its SHA-256.
func KeyID(apiKey string) string {
	sum := sha256.Sum256([]byte(apiKey))
	return "key-" + hex.EncodeToString(sum[:6])
}

func newStats() Stats {
	return Stats{ByStatus: map[int]int{}, ByKey: map[string]KeyStats{}}
}

func (s *Stats) record(keyID string, status int) {
	s.Requests++
	s.ByStatus[status]++
	if keyID == "" {
		return
	}
	k := s.ByKey[keyID]
	if k.ByStatus == nil {
		k.ByStatus = map[int]int{}
	}
	k.Requests++
	k.ByStatus[status]++
	s.ByKey[keyID] = k
}

// addTokens counts tokens charged to keyID's buckets.
func (s *Stats) addTokens(keyID string, input, output int64) {
	s.InputTokens += int(input)
	s.OutputTokens += int(output)
	k := s.ByKey[keyID]
	if k.ByStatus == nil {
		k.ByStatus = map[int]int{}
	}
	k.InputTokens += int(input)
	k.OutputTokens += int(output)
	s.ByKey[keyID] = k
}

func (s Stats) clone() Stats {
	out := s
	out.ByStatus = maps.Clone(s.ByStatus)
	out.ByKey = make(map[string]KeyStats, len(s.ByKey))
	for id, k := range s.ByKey {
		k.ByStatus = maps.Clone(k.ByStatus)
		out.ByKey[id] = k
	}
	return out
}
