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
}

// KeyStats counts one API key's answered requests.
type KeyStats struct {
	// Requests is the number of answered requests with this key.
	Requests int `json:"requests"`
	// ByStatus counts them by HTTP status.
	ByStatus map[int]int `json:"by_status"`
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

func (s Stats) clone() Stats {
	out := Stats{Requests: s.Requests, InFlight: s.InFlight, ByStatus: maps.Clone(s.ByStatus), ByKey: make(map[string]KeyStats, len(s.ByKey))}
	for id, k := range s.ByKey {
		out.ByKey[id] = KeyStats{Requests: k.Requests, ByStatus: maps.Clone(k.ByStatus)}
	}
	return out
}
