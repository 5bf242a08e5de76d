package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// encodedJob is what writeJSON wrote for job before writeJob: the reference appendJob must match.
func encodedJob(job *jobs.Job, eventsURL string) ([]byte, error) {
	var v any = job
	if eventsURL != "" {
		v = jobJSON{Job: job, EventsURL: eventsURL}
	}
	var buf bytes.Buffer
	err := json.NewEncoder(&buf).Encode(v)
	return buf.Bytes(), err
}

func requireAppendJobAsEncoder(t *testing.T, job *jobs.Job, eventsURL string) {
	t.Helper()
	want, wantErr := encodedJob(job, eventsURL)
	got, ok := appendJob(nil, job, eventsURL)
	if wantErr != nil {
		require.False(t, ok, "the encoder refused (%v); appendJob wrote %s", wantErr, got)
		return
	}
	require.True(t, ok, "the encoder wrote %s", want)
	require.Equal(t, string(want), string(got))
}

func ptr[T any](v T) *T { return &v }

func sampleJobs() []*jobs.Job {
	at := time.Date(2026, 12, 6, 9, 30, 1, 123456789, time.UTC)
	plain := &jobs.Job{ID: "0b6c2f1e-5d7a-4c1e-9a53-2f6a1c0e7d11", Status: jobs.StatusQueued, Credential: "anthropic",
		MaxAttempts: 5, Timeout: jobs.Duration(10 * time.Minute), Deadline: at.Add(10 * time.Minute), CreatedAt: at,
		Lane: "online", Priority: "normal"}
	full := *plain
	full.Fallbacks = []string{"openai", "a<b>&\"c\\"}
	full.AnsweredBy, full.IdempotencyKey = ptr("anthropic"), ptr("key\u2028\u2029\x01\x1f\b\f\n\r\t\xff\xfeé€😀")
	full.AttemptTimeout, full.FirstByteTimeout = ptr(jobs.Duration(1500*time.Microsecond)), ptr(jobs.Duration(0))
	full.StartedAt, full.FinishedAt = ptr(at.In(time.FixedZone("", 5*3600+30*60))), ptr(at.Add(time.Second))
	full.NextAttemptAt = ptr(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC))
	full.LastError = &jobs.LastError{Class: "rate_limited", Status: 429, Type: "<x>", Message: "slow & down", RetryAfterMS: ptr(int64(-3))}
	// jsonb's text form, as Postgres returns it: a space after every colon and comma.
	full.Result = json.RawMessage(`{"id": "msg_1", "content": [{"text": "<b>a & b</b>\u2028", "type": "text"}]}`)
	full.Usage = json.RawMessage(` {"input_tokens": 12, "output_tokens": 3} `)
	full.Metadata = json.RawMessage("{\"k\": \"\u2029\", \"n\": [1, 2.5e3, null, true]}")
	full.DeadReason, full.BatchID, full.BatchState, full.CostClass = ptr(""), ptr("b1"), ptr("waiting"), ptr("online")
	emptyFallbacks := *plain
	emptyFallbacks.Fallbacks = []string{}
	emptyFallbacks.LastError = &jobs.LastError{Class: "transport"}
	badYear := *plain
	badYear.Deadline = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	badZone := *plain
	badZone.StartedAt = ptr(at.In(time.FixedZone("", 24*3600)))
	secondsZone := *plain
	secondsZone.StartedAt = ptr(at.In(time.FixedZone("", 3600+30)))
	negYear := *plain
	negYear.CreatedAt = time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)
	badRaw := *plain
	badRaw.Metadata = json.RawMessage(`{"a": }`)
	emptyRaw := *plain
	emptyRaw.Result = json.RawMessage{}
	return []*jobs.Job{plain, &full, &emptyFallbacks, &badYear, &badZone, &secondsZone, &negYear, &badRaw, &emptyRaw}
}

func TestAppendJob_AsTheEncoderWrote(t *testing.T) {
	t.Parallel()
	for _, job := range sampleJobs() {
		for _, url := range []string{"", "/v1/jobs/x/events?token=a&b=<c>"} {
			requireAppendJobAsEncoder(t, job, url)
		}
	}
}

// TestAppendJob_StoredJSONCompacted pins the bytes of a job whose stored JSON is Postgres's jsonb
// text (spaces after colons and commas): compacted and HTML-escaped, as the encoder wrote them.
func TestAppendJob_StoredJSONCompacted(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 6, 9, 30, 1, 500000000, time.UTC)
	job := &jobs.Job{ID: "id-1", Status: jobs.StatusSucceeded, Credential: "c", AnsweredBy: ptr("c"), Attempts: 1,
		MaxAttempts: 3, Timeout: jobs.Duration(time.Minute), Deadline: at, CreatedAt: at, FinishedAt: &at,
		Result: json.RawMessage(`{"content": [{"text": "a<b"}], "id": "m"}`), Usage: json.RawMessage(`{"input_tokens": 2, "output_tokens": 1}`),
		Metadata: json.RawMessage(`{"team": "x & y"}`), Lane: "online", CostClass: ptr("online"), Priority: "normal"}
	got, ok := appendJob(nil, job, "")
	require.True(t, ok)
	require.Equal(t, `{"id":"id-1","status":"succeeded","credential":"c","fallbacks":null,"answered_by":"c","idempotency_key":null,`+
		`"attempts":1,"max_attempts":3,"timeout":"1m0s","attempt_timeout":null,"first_byte_timeout":null,`+
		`"deadline":"2026-12-06T09:30:01.5Z","created_at":"2026-12-06T09:30:01.5Z","started_at":null,`+
		`"finished_at":"2026-12-06T09:30:01.5Z","next_attempt_at":null,"last_error":null,`+
		`"result":{"content":[{"text":"a\u003cb"}],"id":"m"},"usage":{"input_tokens":2,"output_tokens":1},"dead_reason":null,`+
		`"metadata":{"team":"x \u0026 y"},"lane":"online","batch_id":null,"batch_state":null,"cost_class":"online","priority":"normal"}`+"\n", string(got))
	requireAppendJobAsEncoder(t, job, "")
}

// FuzzAppendJob: as TestAppendJob_AsTheEncoderWrote, with any text in the job's strings and
// stored JSON, any time and any duration.
func FuzzAppendJob(f *testing.F) {
	f.Add("id", "cred", "key\u2028<&>", "msg\x00\xff", []byte(`{"a": [1, "x"]}`), int64(0), int64(0), 0, int64(0), "")
	f.Add("", "", "", "", []byte(`{`), int64(253402300800), int64(999999999), 3600, int64(-1), "/e?a&b")
	f.Add("é😀", "\\\"", "\t", "\u2029", []byte(" null "), int64(-62135596801), int64(1), 30, int64(1500), "u")
	f.Add("a", "b", "c", "d", []byte("[\"\u2028<\", 1e400, {\"k\" : \"\xff\"}]"), int64(1e9), int64(5e8), -12*3600, int64(1<<62), "")
	f.Fuzz(func(t *testing.T, id, cred, key, msg string, raw []byte, unix, nsec int64, zone int, d int64, url string) {
		at := time.Unix(unix, nsec).In(time.FixedZone("", zone))
		job := &jobs.Job{ID: id, Status: jobs.Status(msg), Credential: cred, Fallbacks: []string{key, cred},
			IdempotencyKey: &key, Timeout: jobs.Duration(d), AttemptTimeout: ptr(jobs.Duration(-d)), Deadline: at,
			CreatedAt: at, StartedAt: &at, Result: raw, Metadata: raw,
			LastError: &jobs.LastError{Class: key, Type: msg, Message: id}, Lane: jobs.Lane(key), Priority: jobs.Priority(cred)}
		requireAppendJobAsEncoder(t, job, url)
	})
}

// fillValue sets v, and every field of a struct it is or points to, to a value no field's zero or
// omitempty hides, n numbering its strings and numbers apart.
func fillValue(t *testing.T, v reflect.Value, n *int) {
	t.Helper()
	*n++
	switch {
	case v.Type() == reflect.TypeFor[json.RawMessage]():
		v.SetBytes([]byte(`{"n": ` + strconv.Itoa(*n) + `}`))
	case v.Type() == reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Date(2026, 12, 6, 9, 30, *n, *n, time.FixedZone("", 3600))))
	default:
		switch v.Kind() {
		case reflect.String:
			v.SetString("s" + strconv.Itoa(*n))
		case reflect.Int, reflect.Int64:
			v.SetInt(int64(*n))
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Pointer:
			v.Set(reflect.New(v.Type().Elem()))
			fillValue(t, v.Elem(), n)
		case reflect.Slice:
			v.Set(reflect.MakeSlice(v.Type(), 2, 2))
			fillValue(t, v.Index(0), n)
			fillValue(t, v.Index(1), n)
		case reflect.Struct:
			for i := range v.NumField() {
				if v.Type().Field(i).IsExported() {
					fillValue(t, v.Field(i), n)
				}
			}
		default:
			t.Fatalf("fillValue: a %s (kind %s): teach it that kind", v.Type(), v.Kind())
		}
	}
}

// TestAppendJob_EveryField fails when jobs.Job (or a struct it holds, or the answer's jobJSON)
// gains a field appendJob does not write, omitempty or not: every field set by reflection.
func TestAppendJob_EveryField(t *testing.T) {
	t.Parallel()
	job, n := new(jobs.Job), 0
	fillValue(t, reflect.ValueOf(job).Elem(), &n)
	requireAppendJobAsEncoder(t, job, "")
	requireAppendJobAsEncoder(t, job, "/v1/jobs/x/events?token=t")
	// jobJSON is the job and its events_url: a field added to it must be added to appendJob.
	typ := reflect.TypeFor[jobJSON]()
	require.Equal(t, 2, typ.NumField(), "jobJSON's fields: add the new one to appendJob and here")
	require.Equal(t, reflect.TypeFor[*jobs.Job](), typ.Field(0).Type)
	require.Equal(t, "EventsURL", typ.Field(1).Name)
}

// TestWriteJob_AsWriteJSON: writeJob answers as writeJSON(s.answer(job)) did: status, headers,
// body (the encoder's newline included), with and without a stream signer, and for a job only
// writeJSON writes (its refusal: the status and an empty body).
func TestWriteJob_AsWriteJSON(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	signer, err := NewStreamSigner(bytes.Repeat([]byte("k"), 32), 10*time.Minute, func() time.Time { return now })
	require.NoError(t, err)
	for _, signer := range []*StreamSigner{nil, signer} {
		s := &Server{cfg: Config{StreamSigner: signer}}
		for _, job := range sampleJobs() {
			for _, status := range []int{http.StatusOK, http.StatusAccepted} {
				want, got := httptest.NewRecorder(), httptest.NewRecorder()
				writeJSON(want, status, s.answer(job))
				s.writeJob(got, status, job)
				require.Equal(t, want.Code, got.Code)
				require.Equal(t, want.Header(), got.Header())
				require.Equal(t, want.Body.String(), got.Body.String())
			}
		}
	}
}

// TestWriteJob_LargeAnswersBufferIsLeftToTheCollector: the buffer of an answer larger than
// maxPooledAnswer (a job with a large result) is not given back to the Server's pool, which
// would hold it for every answer after it (TestWriteJob_Allocs pins that a usual answer's is).
func TestWriteJob_LargeAnswersBufferIsLeftToTheCollector(t *testing.T) {
	t.Parallel()
	job := *sampleJobs()[0]
	job.Result = json.RawMessage(`{"text": "` + strings.Repeat("a", maxPooledAnswer) + `"}`)
	s := &Server{}
	rec := httptest.NewRecorder()
	s.writeJob(rec, http.StatusOK, &job)
	require.Greater(t, rec.Body.Len(), maxPooledAnswer)
	// sync.Pool may drop what it is given (under the race detector at random): whatever it
	// answers, none is the large answer's buffer.
	for range 4 {
		buf, _ := s.answers.Get().(*[]byte)
		if buf == nil {
			break
		}
		require.LessOrEqual(t, cap(*buf), maxPooledAnswer)
	}
}

// headerWriter is an http.ResponseWriter that keeps nothing: TestWriteJob_Allocs counts writeJob's.
type headerWriter http.Header

func (w headerWriter) Header() http.Header       { return http.Header(w) }
func (headerWriter) Write(b []byte) (int, error) { return len(b), nil }
func (headerWriter) WriteHeader(int)             {}

// TestWriteJob_Allocs pins that a submit's answer is written without the encoder's reflection
// (writeJSON, which it replaced, allocated for the encoder and every field it boxed), and without
// an allocation of its own: its buffer is pooled and the Content-Type header's value shared (they
// were 2 at every answer).
func TestWriteJob_Allocs(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	job, s, w := sampleJobs()[0], &Server{}, headerWriter{}
	buf := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := appendJob(buf[:0], job, ""); !ok {
			panic("refused")
		}
	})
	require.Zero(t, allocs)
	allocs = testing.AllocsPerRun(100, func() { s.writeJob(w, http.StatusAccepted, job) })
	if raceEnabled { // the race detector's sync.Pool drops pooled buffers at random
		require.LessOrEqual(t, allocs, 1.0)
	} else {
		require.Zero(t, allocs)
	}
	require.Equal(t, []string{"application/json"}, http.Header(w).Values("Content-Type"))
	allocs = testing.AllocsPerRun(100, func() { writeJSON(w, http.StatusAccepted, s.answer(job)) })
	require.Greater(t, allocs, 2.0, "writeJSON, the reference, allocates more")
}

// TestEscapeHTMLTail_AsHTMLEscape: escaping in place gives json.HTMLEscape's bytes, the prefix
// left alone.
func TestEscapeHTMLTail_AsHTMLEscape(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "a", "<", "a<b>c&d", "\u2028", "x\u2029y", "<\u2028>&\u2029&",
		"\xe2\x80", "\xe2\x80\xa7\xe2", "é<\u2028\u2028", strings.Repeat("<a&\u2029", 100)} {
		var want bytes.Buffer
		json.HTMLEscape(&want, []byte(s))
		got := escapeHTMLTail(append([]byte("<pre>"), s...), len("<pre>"))
		require.Equal(t, "<pre>"+want.String(), string(got), "%q", s)
	}
}

func FuzzEscapeHTMLTail(f *testing.F) {
	f.Add([]byte("a<b>c&d\u2028e\u2029"), 1)
	f.Fuzz(func(t *testing.T, b []byte, start int) {
		start = min(max(start, 0), len(b))
		var want bytes.Buffer
		want.Write(b[:start])
		json.HTMLEscape(&want, b[start:])
		require.Equal(t, want.Bytes(), escapeHTMLTail(slices.Clone(b), start))
	})
}
