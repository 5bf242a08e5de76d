package api

import (
	"context"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/llmq/llmq/internal/httpserve"
	"github.com/llmq/llmq/internal/httpserve/httpservetest"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/openapitest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
	"github.com/llmq/llmq/internal/tenant"
)

// openAPIDoc is the part of api/openapi.yaml the test checks: paths, methods, statuses.
type openAPIDoc struct {
	OpenAPI string                          `yaml:"openapi"`
	Paths   map[string]map[string]yaml.Node `yaml:"paths"`
}

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// loadOpenAPI returns the documented operations: "METHOD path" → statuses.
func loadOpenAPI(t *testing.T) map[string][]int {
	t.Helper()
	raw, err := os.ReadFile("../../api/openapi.yaml")
	require.NoError(t, err)
	var doc openAPIDoc
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	require.Equal(t, "3.1.0", doc.OpenAPI)
	ops := map[string][]int{}
	for path, item := range doc.Paths {
		for method, node := range item {
			if !slices.Contains(httpMethods, method) {
				continue
			}
			var op struct {
				Responses map[string]any `yaml:"responses"`
			}
			require.NoError(t, node.Decode(&op))
			var statuses []int
			for code := range op.Responses {
				n, err := strconv.Atoi(code)
				require.NoError(t, err, "%s %s: response %q", method, path, code)
				statuses = append(statuses, n)
			}
			slices.Sort(statuses)
			ops[strings.ToUpper(method)+" "+path] = statuses
		}
	}
	return ops
}

// statusRecorder records the route pattern, method and status of every answer.
type statusRecorder struct {
	mu   sync.Mutex
	seen map[string][]int
}

func (rec *statusRecorder) wrap(s *Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pattern := s.mux.Handler(r)
		sw := &openapitest.Recorder{ResponseWriter: w}
		s.ServeHTTP(sw, r)
		if sw.Status == 0 {
			sw.Status = http.StatusOK // a HEAD's handler may write nothing
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		key := r.Method + " " + pattern
		if !slices.Contains(rec.seen[key], sw.Status) {
			rec.seen[key] = append(rec.seen[key], sw.Status)
		}
	})
}

// TestOpenAPI_MatchesServer checks api/openapi.yaml against the server both ways: every route and
// method the server registers is documented and every documented operation is registered; every
// status the server answered below is documented for its operation, and every documented status
// was answered (except 500, which only a bug produces). The bodies are checked too: every test's
// server (setup, and the end-to-end suite's) checks each answer against its schema
// (openapitest.Handler).
func TestOpenAPI_MatchesServer(t *testing.T) {
	t.Parallel()
	ops := loadOpenAPI(t)
	// The console's operations are served by its own handler under /console/ and checked both
	// ways by its tests (console's TestRoutes_MatchOpenAPI); here they meet the connection cap.
	apiOps := maps.Clone(ops)
	maps.DeleteFunc(apiOps, func(op string, _ []int) bool {
		_, path, _ := strings.Cut(op, " ")
		return path == "/console" || strings.HasPrefix(path, "/console/")
	})
	rec := &statusRecorder{seen: map[string][]int{}}
	rate, err := tenant.NewRateLimiter(redistest.Client(t), &tenant.RateLimiterConfig{
		Rate: tenant.Rate{PerSecond: 0.001, Burst: 8}, Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	b := setup(t, setupOpts{maxBody: 1024, wrap: rec.wrap, submitRate: rate, maxStreams: 1,
		server: &httpserve.Config{ReadTimeout: time.Second}})
	down := setupUnavailable(t, rec)
	revoked := b.newTenant(t, "revoked")
	_, err = b.tenants.Revoke(context.Background(), "revoked")
	require.NoError(t, err)
	limited := b.newTenant(t, "limited")

	// Every route of the server is documented, and nothing else is.
	var registered []string
	for _, rt := range b.srv.routes {
		for m := range rt.methods {
			registered = append(registered, m+" "+rt.pattern)
		}
	}
	slices.Sort(registered)
	documented := slices.Sorted(func(yield func(string) bool) {
		for k := range apiOps {
			if !yield(k) {
				return
			}
		}
	})
	require.Equal(t, registered, documented)

	// Make the server give every answer it can.
	body := `{"request":{"model":"m"}}`
	key := map[string]string{"Idempotency-Key": "openapi-1"}
	bearer := map[string]string{"Authorization": "Bearer x"}
	gz := "\x1f\x8b\x08\x00" // gzip's header: a body that is no JSON as sent
	created := b.do(t, http.MethodPost, "/v1/jobs", body, key)
	id := created.body["id"].(string)
	b.do(t, http.MethodPost, "/v1/jobs", body, key)                                                // 200 replay
	b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"other"}}`, key)                     // 422
	b.do(t, http.MethodPost, "/v1/jobs", `{"request":`, nil)                                       // 400
	b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"m":"`+strings.Repeat("x", 2000)+`"}}`, nil) // 413
	b.do(t, http.MethodPost, "/v1/jobs", body, bearer)                                             // 401
	b.do(t, http.MethodPost, "/v1/jobs", gz, map[string]string{"Content-Encoding": "gzip"})        // 415
	b.do(t, http.MethodPost, "/v1/jobs", body, revoked)                                            // 403
	for range 9 {
		b.do(t, http.MethodPost, "/v1/jobs", body, limited) // 202 for its burst of 8, then 429
	}
	b.do(t, http.MethodGet, "/v1/jobs/"+id, "", revoked)           // 403
	b.do(t, http.MethodGet, "/v1/jobs/"+id+"/events", "", revoked) // 403
	b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", revoked)        // 403
	for _, path := range []string{"/v1/jobs/" + id, "/v1/jobs/" + id + "/events"} {
		b.do(t, http.MethodGet, path, "", bearer)                                                              // 401
		b.do(t, http.MethodGet, strings.Replace(path, id, "0190a5b2-7c1e-7d3f-9a8b-123456789abc", 1), "", nil) // 404
	}
	done := b.create(t, "") // a job that ended other than canceled
	b.attempt(t, done.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
	b.do(t, http.MethodGet, "/v1/jobs/"+id, "", nil)                                                          // 200
	b.do(t, http.MethodGet, "/v1/jobs/"+id+"/events", "", map[string]string{"Last-Event-ID": "x"})            // 400
	b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", bearer)                                                    // 401
	b.do(t, http.MethodDelete, "/v1/jobs/0190a5b2-7c1e-7d3f-9a8b-123456789abc", "", nil)                      // 404
	b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil)                                                       // 200
	b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil)                                                       // 200, canceled before
	b.do(t, http.MethodDelete, "/v1/jobs/"+done.ID, "", nil)                                                  // 409
	canceled := openStream(t, b.url, id, "").rest(t)                                                          // 200, ends: canceled
	b.do(t, http.MethodGet, "/v1/jobs/"+id+"/events", "", map[string]string{"Last-Event-ID": canceled[0].id}) // 204
	for _, h := range []map[string]string{nil, bearer, revoked} {
		b.do(t, http.MethodHead, "/v1/jobs/"+id, "", h) // 200, 401, 403
	}
	b.do(t, http.MethodHead, "/v1/jobs/0190a5b2-7c1e-7d3f-9a8b-123456789abc", "", nil) // 404
	b.do(t, http.MethodOptions, "/v1/jobs/"+id+"/events", "", map[string]string{"Origin": "https://app.example",
		"Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "last-event-id"}) // 204
	require.Eventually(t, func() bool { return b.openStreams("default") == 0 }, httpservetest.Wait, 5*time.Millisecond)
	waiting := b.create(t, "")
	open := openStream(t, b.url, waiting.ID, "")
	open.nextEvent(t)
	b.do(t, http.MethodGet, "/v1/jobs/"+waiting.ID+"/events", "", nil) // 429: the tenant's one stream is open
	open.close()
	trickle := httpservetest.Dial(t, strings.TrimPrefix(b.url, "http://"), 0)
	trickle.Send(t, http.MethodPost, "/v1/jobs", "Content-Length: 1000")
	stopTrickle := trickle.Trickle(20*time.Millisecond, 1000)
	require.Equal(t, http.StatusRequestTimeout, trickle.Response(t).StatusCode) // 408
	stopTrickle()
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		b.do(t, http.MethodGet, p, "", nil)
		b.do(t, http.MethodHead, p, "", nil)
	}
	for _, r := range []struct{ method, path string }{
		{http.MethodPost, "/v1/jobs"}, {http.MethodGet, "/v1/jobs/" + id}, {http.MethodHead, "/v1/jobs/" + id},
		{http.MethodDelete, "/v1/jobs/" + id}, {http.MethodGet, "/v1/jobs/" + id + "/events"},
		{http.MethodGet, "/readyz"}, {http.MethodHead, "/readyz"},
	} {
		b := body
		if r.method != http.MethodPost {
			b = ""
		}
		do(t, down, r.method, r.path, b, nil) // 503
	}

	overCap(t, ops, id, rec)
	cancelsOverShare(t, rec)
	answersOverShare(t, rec)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	for op, statuses := range rec.seen {
		if strings.HasSuffix(op, " /") {
			continue // the catch-all 404 of unknown paths
		}
		for _, st := range statuses {
			require.Contains(t, ops[op], st, "%s answered %d, which api/openapi.yaml does not document", op, st)
		}
	}
	for op, statuses := range apiOps {
		for _, st := range statuses {
			if st == http.StatusInternalServerError {
				continue
			}
			require.Contains(t, rec.seen[op], st, "api/openapi.yaml documents %d for %s, which the test never saw", st, op)
		}
	}
}

// cancelsOverShare serves an API whose tenant "default" holds every one of its places among the
// keyed submits and cancels: its DELETE waits the bound (storeWait) for one, then is answered 429
// too_many_cancels. It records the answer in rec.
func cancelsOverShare(t *testing.T, rec *statusRecorder) {
	t.Helper()
	b := setup(t, setupOpts{wrap: rec.wrap, storeWait: 50 * time.Millisecond})
	job := b.create(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), httpservetest.Wait)
	defer cancel()
	for range b.srv.keyed.max {
		release, err := b.srv.keyed.enter(ctx, tenant.Default, 0, tooManyCancels)
		require.NoError(t, err)
		defer release()
	}
	require.Equal(t, http.StatusTooManyRequests, b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil).status)
}

// answersOverShare serves an API whose tenant "default" holds its share of the budget for job
// results being answered: a poll of a job with a result, GET or HEAD, is answered 429
// too_many_answers. It records the answers in rec.
func answersOverShare(t *testing.T, rec *statusRecorder) {
	t.Helper()
	b := setup(t, setupOpts{wrap: rec.wrap})
	job := b.create(t, "")
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
	require.Equal(t, bodyTaken, b.srv.answerBytes.take(tenant.Default, b.srv.answerBytes.share))
	defer b.srv.answerBytes.give(tenant.Default, b.srv.answerBytes.share)
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		require.Equal(t, http.StatusTooManyRequests, b.do(t, method, "/v1/jobs/"+job.ID, "", nil).status, method)
	}
}

// overCap serves an API whose connection cap (api.max_connections) is 1, and holds that one
// connection: every documented operation, asked on another connection, gets the listener's 503,
// which no handler sees. It checks each answer against api/openapi.yaml and records it in rec.
func overCap(t *testing.T, ops map[string][]int, id string, rec *statusRecorder) {
	t.Helper()
	b := setup(t, setupOpts{listener: func(ln net.Listener) net.Listener { return httpserve.LimitListener(ln, 1, nil) }})
	addr := strings.TrimPrefix(b.url, "http://")
	held := httpservetest.Dial(t, addr, 0)
	require.Equal(t, http.StatusOK, held.Get(t, "/healthz").StatusCode, "the connection under the cap")
	spec := openapitest.Load(t)
	for op := range ops {
		method, path, _ := strings.Cut(op, " ")
		path = strings.NewReplacer("{id}", id, "{name}", "acme", "{file}", "app.js").Replace(path)
		c := httpservetest.Dial(t, addr, 0)
		c.Send(t, method, path)
		resp := c.Head(t)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s over the connection cap", op)
		require.NoError(t, spec.Check(method, path, resp.StatusCode, resp.Header, body), "%s over the connection cap", op)
		rec.mu.Lock()
		if !slices.Contains(rec.seen[op], resp.StatusCode) {
			rec.seen[op] = append(rec.seen[op], resp.StatusCode)
		}
		rec.mu.Unlock()
	}
}

// setupUnavailable serves an API whose Postgres and Redis are unreachable, recorded by rec, and
// returns its URL.
func setupUnavailable(t *testing.T, rec *statusRecorder) string {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	store := jobs.NewStore(pool, nil)
	s := New(Config{
		Store: store, Pool: pool, Redis: rdb, AllowAnonymous: true,
		Submit: SubmitConfig{Credentials: []string{"default"}},
	})
	hs := httptest.NewServer(openapitest.Handler(t, rec.wrap(s)))
	t.Cleanup(hs.Close)
	return hs.URL
}

// lastErrorClass is api/openapi.yaml's LastError.class.
func lastErrorClass(t *testing.T) (class struct {
	Enum        []string `yaml:"enum"`
	Description string   `yaml:"description"`
}) {
	t.Helper()
	raw, err := os.ReadFile("../../api/openapi.yaml")
	require.NoError(t, err)
	var doc struct {
		Components struct {
			Schemas struct {
				LastError struct {
					Properties struct {
						Class struct {
							Enum        []string `yaml:"enum"`
							Description string   `yaml:"description"`
						} `yaml:"class"`
					} `yaml:"properties"`
				} `yaml:"LastError"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	return doc.Components.Schemas.LastError.Properties.Class
}

// TestOpenAPI_LastErrorClasses: LastError.class lists exactly the classes a job's last_error can
// carry: every failure class of the retry policy, and the deadline.
func TestOpenAPI_LastErrorClasses(t *testing.T) {
	t.Parallel()
	class := lastErrorClass(t)
	sent := []string{jobs.ReasonDeadlineExceeded}
	for _, c := range []retrypolicy.Class{
		retrypolicy.ClassRetryable, retrypolicy.ClassRateLimited, retrypolicy.ClassSpendCap, retrypolicy.ClassTimeout,
		retrypolicy.ClassNetwork, retrypolicy.ClassPermanent, retrypolicy.ClassInternal, retrypolicy.ClassCanceled,
	} {
		sent = append(sent, string(c))
	}
	require.ElementsMatch(t, sent, class.Enum)
}

// TestOpenAPI_RetryableStatuses: LastError.class's description lists, one by one, the provider
// statuses of class retryable, and they are exactly those the retry policy retries (429 aside:
// its class is rate_limited or spend_cap by its Retry-After).
func TestOpenAPI_RetryableStatuses(t *testing.T) {
	t.Parallel()
	class := lastErrorClass(t)
	m := regexp.MustCompile("`retryable` \\(([^)]*)\\)").FindStringSubmatch(class.Description)
	require.NotNil(t, m, "LastError.class's description names the statuses of retryable in parentheses")
	var documented []int
	for _, f := range strings.Split(m[1], ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(t, err, "retryable (%s): list the statuses one by one", m[1])
		documented = append(documented, n)
	}
	var retried []int
	for status := 400; status < 600; status++ {
		if status == http.StatusTooManyRequests {
			continue
		}
		if retrypolicy.Classify(&llm.StatusError{StatusCode: status}, time.Now()).Class == retrypolicy.ClassRetryable {
			retried = append(retried, status)
		}
	}
	require.Equal(t, retried, documented, "the statuses LastError.class calls retryable")
}
