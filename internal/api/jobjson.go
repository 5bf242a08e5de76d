package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/llmq/llmq/internal/jobs"
)

// writeJob writes job as the API answers with it (s.answer), the bytes writeJSON's encoder
// writes, without its reflection (~30 k instructions a submit, issue 23): appendJob's; a job it
// cannot write for sure (a time json refuses, a stored JSON value that is not valid) goes to
// writeJSON, which says so as it always did.
func (s *Server) writeJob(w http.ResponseWriter, status int, job *jobs.Job) {
	eventsURL := ""
	if s.cfg.StreamSigner != nil {
		eventsURL = s.cfg.StreamSigner.URL(job.ID)
	}
	buf, _ := s.answers.Get().(*[]byte)
	if buf == nil {
		b := make([]byte, 0, 1024)
		buf = &b
	}
	defer s.putAnswerBuffer(buf)
	b, ok := appendJob((*buf)[:0], job, eventsURL)
	*buf = b
	if !ok {
		writeJSON(w, status, s.answer(job))
		return
	}
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	_, _ = w.Write(b) // a Writer keeps nothing of b (io.Writer): the buffer is used again
}

// maxPooledAnswer is the largest buffer writeJob gives back to Server.answers: the answer of a
// job with a large request or result is rare, and its buffer is left to the collector rather
// than held for every answer after it.
const maxPooledAnswer = 64 << 10

// putAnswerBuffer gives buf back to s.answers, unless it grew past maxPooledAnswer.
func (s *Server) putAnswerBuffer(buf *[]byte) {
	if cap(*buf) <= maxPooledAnswer {
		s.answers.Put(buf)
	}
}

// jsonContentType is the Content-Type header's value of a JSON answer, one list shared by every
// answer that writeJob writes: the header's Set made a list of its own at every answer. It is
// never written to: Header.Set replaces a key's list and Header.Add appends to a full one (it
// copies).
var jsonContentType = []string{"application/json"}

// appendJob appends job's JSON as json.NewEncoder(w).Encode(jobJSON{job, eventsURL}) writes
// it, its newline included; ok is false when that encode would fail or when a field needs what
// appendJob leaves to json (a time out of json's range, a json.RawMessage json refuses).
func appendJob(b []byte, j *jobs.Job, eventsURL string) (_ []byte, ok bool) {
	b = append(b, `{"id":`...)
	b = appendString(b, j.ID)
	b = append(b, `,"status":`...)
	b = appendString(b, string(j.Status))
	b = append(b, `,"credential":`...)
	b = appendString(b, j.Credential)
	b = append(b, `,"fallbacks":`...)
	if j.Fallbacks == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, f := range j.Fallbacks {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, f)
		}
		b = append(b, ']')
	}
	b = append(b, `,"answered_by":`...)
	b = appendStringPtr(b, j.AnsweredBy)
	b = append(b, `,"idempotency_key":`...)
	b = appendStringPtr(b, j.IdempotencyKey)
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(j.Attempts), 10)
	b = append(b, `,"max_attempts":`...)
	b = strconv.AppendInt(b, int64(j.MaxAttempts), 10)
	b = append(b, `,"timeout":`...)
	b = appendString(b, time.Duration(j.Timeout).String())
	b = append(b, `,"attempt_timeout":`...)
	b = appendDurationPtr(b, j.AttemptTimeout)
	b = append(b, `,"first_byte_timeout":`...)
	b = appendDurationPtr(b, j.FirstByteTimeout)
	b = append(b, `,"deadline":`...)
	if b, ok = appendTime(b, &j.Deadline); !ok {
		return b, false
	}
	b = append(b, `,"created_at":`...)
	if b, ok = appendTime(b, &j.CreatedAt); !ok {
		return b, false
	}
	for _, t := range [...]struct {
		name string
		t    *time.Time
	}{{`,"started_at":`, j.StartedAt}, {`,"finished_at":`, j.FinishedAt}, {`,"next_attempt_at":`, j.NextAttemptAt}} {
		b = append(b, t.name...)
		if b, ok = appendTime(b, t.t); !ok {
			return b, false
		}
	}
	b = append(b, `,"last_error":`...)
	if j.LastError == nil {
		b = append(b, "null"...)
	} else {
		// Rare on the answers that count (a submit's job has none): the encoder's own bytes, so
		// that a field added to jobs.LastError needs nothing here.
		e, err := json.Marshal(j.LastError)
		if err != nil {
			return b, false
		}
		b = append(b, e...)
	}
	b = append(b, `,"result":`...)
	if b, ok = appendRaw(b, j.Result); !ok {
		return b, false
	}
	b = append(b, `,"usage":`...)
	if b, ok = appendRaw(b, j.Usage); !ok {
		return b, false
	}
	b = append(b, `,"dead_reason":`...)
	b = appendStringPtr(b, j.DeadReason)
	b = append(b, `,"metadata":`...)
	if b, ok = appendRaw(b, j.Metadata); !ok {
		return b, false
	}
	b = append(b, `,"lane":`...)
	b = appendString(b, string(j.Lane))
	b = append(b, `,"batch_id":`...)
	b = appendStringPtr(b, j.BatchID)
	b = append(b, `,"batch_state":`...)
	b = appendStringPtr(b, j.BatchState)
	b = append(b, `,"cost_class":`...)
	b = appendStringPtr(b, j.CostClass)
	b = append(b, `,"priority":`...)
	b = appendString(b, string(j.Priority))
	if eventsURL != "" {
		b = append(b, `,"events_url":`...)
		b = appendString(b, eventsURL)
	}
	return append(b, "}\n"...), true
}

func appendStringPtr(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendString(b, *s)
}

func appendDurationPtr(b []byte, d *jobs.Duration) []byte {
	if d == nil {
		return append(b, "null"...)
	}
	return appendString(b, time.Duration(*d).String())
}

// appendTime appends t (null when nil) as time.Time's MarshalJSON does; ok is false for a time
// it refuses (a year outside 0-9999, a zone offset of seconds or past 23 hours).
func appendTime(b []byte, t *time.Time) (_ []byte, ok bool) {
	if t == nil {
		return append(b, "null"...), true
	}
	out, err := t.AppendText(append(b, '"'))
	if err != nil {
		return b, false
	}
	return append(out, '"'), true
}

// appendRaw appends raw (null when nil) compacted and HTML-escaped, as the encoder writes a
// json.RawMessage; ok is false for raw json refuses. It compacts into b, then escapes in place
// (escapeHTMLTail): an answer of 800 kB was compacted into a buffer of its own and escaped into
// b, each grown as it was written, about 10 MB allocated a poll for an answer rich in <, > and &.
func appendRaw(b []byte, raw json.RawMessage) (_ []byte, ok bool) {
	if raw == nil {
		return append(b, "null"...), true
	}
	start := len(b)
	out := bytes.NewBuffer(b)
	if json.Compact(out, raw) != nil {
		return b, false
	}
	return escapeHTMLTail(out.Bytes(), start), true
}

// escapeHTMLTail escapes b[start:] as json.HTMLEscape does (<, > and & as \u003c, \u003e,
// \u0026; U+2028 and U+2029 as \u2028 and \u2029), in place: b grows once, by what the escapes
// add, and is rewritten from its end.
func escapeHTMLTail(b []byte, start int) []byte {
	const hex = "0123456789abcdef"
	isLineSep := func(b []byte, i int) bool { // U+2028 or U+2029 (E2 80 A8, E2 80 A9) at b[i]
		return b[i] == 0xE2 && i+2 < len(b) && b[i+1] == 0x80 && b[i+2]&^1 == 0xA8
	}
	extra := 0
	for i := start; i < len(b); i++ {
		switch {
		case b[i] == '<' || b[i] == '>' || b[i] == '&':
			extra += 5 // one byte becomes six
		case isLineSep(b, i):
			extra += 3 // three bytes become six
		}
	}
	if extra == 0 {
		return b
	}
	n := len(b)
	b = slices.Grow(b, extra)[:n+extra]
	// Each escape is at least as long as what it replaces: writing from the end never overwrites
	// a byte not yet read. A line separator is recognized at its first byte, read last.
	j := len(b)
	for i := n - 1; i >= start; i-- {
		c := b[i]
		switch {
		case c == '<' || c == '>' || c == '&':
			j -= 6
			b[j], b[j+1], b[j+2], b[j+3], b[j+4], b[j+5] = '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF]
		case i+2 < n && c == 0xE2 && b[i+1] == 0x80 && b[i+2]&^1 == 0xA8:
			// Its last two bytes were copied as they are (j+1, j+2 of the six): undone here.
			last := b[i+2]
			j += 2
			j -= 6
			b[j], b[j+1], b[j+2], b[j+3], b[j+4], b[j+5] = '\\', 'u', '2', '0', '2', hex[last&0xF]
		default:
			j--
			b[j] = c
		}
	}
	return b
}

// appendString appends s quoted as the encoder does with HTML escaping (its default): <, > and
// & as \u003c, \u003e, \u0026, U+2028 and U+2029 escaped, invalid UTF-8 as \ufffd.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
