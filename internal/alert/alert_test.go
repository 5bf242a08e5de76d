package alert_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/logtest"
)

// A webhook that cannot be reached is logged with its host, not its URL: a chat webhook's path
// (Slack's /services/T…/B…/token) is its secret.
func TestRaise_FailedWebhookLogsNoSecretPath(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // the connection dropped: no answer
		}
	}))
	t.Cleanup(srv.Close)
	var logs bytes.Buffer
	a := alert.New(alert.Config{WebhookURL: srv.URL + "/services/T000/B000/XXXXSECRETXXXX",
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a.Raise(ctx, alert.Alert{Credential: "main", Reason: "rate_limited_no_retry_after", JobID: "j1"})
	require.NoError(t, a.Wait(ctx))

	out := logs.String()
	require.Contains(t, out, "alert webhook failed", "the failure is logged")
	require.Contains(t, out, strings.TrimPrefix(srv.URL, "http://"), "with the webhook's host")
	require.NotContains(t, out, "XXXXSECRETXXXX")
}

// Without Redis, Throttled still raises an alert at most once per interval per credential and
// reason, in this process (Config.Redis): a burst of retries_exhausted dead letters is one alert,
// not one per job.
func TestThrottled_WithoutRedisOncePerIntervalPerProcess(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := alert.New(alert.Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Now: func() time.Time { return now }})
	ctx := context.Background()
	raise := func(cred, job string) {
		a.Throttled(ctx, alert.Alert{Credential: cred, Reason: "retries_exhausted", JobID: job}, time.Minute)
	}
	alerts := func() int { return strings.Count(logs.String(), "ALERT dead letter") }

	raise("main", "j1")
	raise("main", "j2")
	require.Equal(t, 1, alerts(), "a second dead letter within the interval is not alerted again")
	raise("backup", "j3")
	require.Equal(t, 2, alerts(), "another credential has a throttle of its own")
	now = now.Add(time.Minute)
	raise("main", "j4")
	require.Equal(t, 3, alerts(), "once the interval has passed the next one is alerted")
}

// TestRaise_CountsWebhookFailures: a POST to the webhook that fails (a status above 299, or no
// answer) counts in llmq_alert_webhook_failures_total, there at 0 from the start; one delivered
// does not. The log line alone left an alert lost on its way to the webhook unalerted.
func TestRaise_CountsWebhookFailures(t *testing.T) {
	t.Parallel()
	answers := make(chan int, 3)
	answers <- http.StatusInternalServerError
	answers <- http.StatusNoContent
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(<-answers)
	}))
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	a := alert.New(alert.Config{WebhookURL: srv.URL, Metrics: alert.NewMetrics(reg)})
	const name = "llmq_alert_webhook_failures_total"
	const head = "# HELP " + name + " Alerts whose POST to alerts.webhook_url failed (no answer, or a status above 299, " +
		"a redirect included) or was not made (8 posts already under way); each is logged (\"alert webhook failed\") " +
		"and not sent again.\n# TYPE " + name + " counter\n"
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(head+name+" 0\n"), name), "0 from the start")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	al := alert.Alert{Credential: "main", Reason: "retries_exhausted", JobID: "j1"}
	a.Raise(ctx, al) // 500
	require.NoError(t, a.Wait(ctx))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(head+name+" 1\n"), name))
	a.Raise(ctx, al) // 204
	require.NoError(t, a.Wait(ctx))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(head+name+" 1\n"), name), "a delivered alert is not counted")
	srv.Close()
	a.Raise(ctx, al) // unreachable
	require.NoError(t, a.Wait(ctx))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(head+name+" 2\n"), name))
}

// A webhook that answers with a redirect is a failure, and nothing follows it: Go's client would
// turn a 301/302/303 into a GET without the body, whose 200 counted the alert as delivered though
// no one received it (an http:// URL redirected to https:// lost every alert silently), and would
// send the body, which names credentials and jobs, again to wherever a 307/308 points.
func TestRaise_RedirectIsAFailureNotFollowed(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			t.Parallel()
			elsewhere := make(chan string, 4)
			target := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				elsewhere <- r.Method // 200
			}))
			t.Cleanup(target.Close)
			hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, target.URL+"/collect", code)
			}))
			t.Cleanup(hook.Close)
			reg := prometheus.NewRegistry()
			var logs bytes.Buffer
			a := alert.New(alert.Config{WebhookURL: hook.URL, Metrics: alert.NewMetrics(reg),
				Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			a.Raise(ctx, alert.Alert{Credential: "main", Reason: "retries_exhausted", JobID: "j1"})
			require.NoError(t, a.Wait(ctx))

			require.Zero(t, len(elsewhere), "the redirect is not followed: nothing reaches its target")
			require.Equal(t, 1.0, webhookFailures(t, reg), "the redirect is counted as a failure")
			require.Contains(t, logs.String(), "a redirect: not followed")
		})
	}
}

// webhookFailures reads llmq_alert_webhook_failures_total from reg.
func webhookFailures(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "llmq_alert_webhook_failures_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("llmq_alert_webhook_failures_total is not registered")
	return 0
}

// watchedAlerter is an Alerter posting to url within postTimeout, whose webhook failures are
// counted in reg and whose log is in logs.
func watchedAlerter(url string, postTimeout time.Duration) (a *alert.Alerter, reg *prometheus.Registry, logs *logtest.Buffer) {
	reg, logs = prometheus.NewRegistry(), &logtest.Buffer{}
	a = alert.New(alert.Config{WebhookURL: url, Metrics: alert.NewMetrics(reg),
		Logger: slog.New(slog.NewJSONHandler(logs, nil)), PostTimeout: postTimeout})
	return a, reg, logs
}

// hungPostTimeout is the Config.PostTimeout of the tests whose webhook hangs until they release
// it: longer than their own deadlines (20 s), so that a post under way ends when the test
// releases it, however long a loaded machine takes to get there, and not by its own timeout (at
// the default 10 s, a run where the 8 posts took that long to reach the webhook counted them as
// failures).
const hungPostTimeout = time.Minute

// hungWebhook is a webhook that answers no POST until release is called (at the latest when the
// test ends); posted receives each one's body as it arrives.
func hungWebhook(t *testing.T) (url string, posted chan string, release func()) {
	t.Helper()
	posted = make(chan string, 16)
	released := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(released) }) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		posted <- string(body)
		<-released
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(release) // before srv.Close, which waits for the handlers
	return srv.URL, posted, release
}

// Raise does not wait for the webhook: the executor raises a spend cap's alert before it records
// the dead letter or fails the job over to its next credential, which waited up to 10 s for a
// slow or hung webhook (and the batcher's pass with it).
func TestRaise_DoesNotWaitForTheWebhook(t *testing.T) {
	t.Parallel()
	url, posted, release := hungWebhook(t)
	a := alert.New(alert.Config{WebhookURL: url, PostTimeout: hungPostTimeout})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	raised := make(chan struct{})
	go func() {
		defer close(raised)
		a.Raise(ctx, alert.Alert{Credential: "main", Reason: "rate_limited_no_retry_after", JobID: "j1"})
	}()
	select {
	case <-raised:
	case <-ctx.Done(): // the POST's own timeout is longer: a Raise waiting for it ends here
		t.Fatal("Raise waited for the webhook's answer")
	}
	select {
	case body := <-posted:
		require.Contains(t, body, `"job_id":"j1"`, "the alert is posted all the same")
	case <-ctx.Done():
		t.Fatal("the alert never reached the webhook")
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer waitCancel()
	require.ErrorIs(t, a.Wait(waitCtx), context.DeadlineExceeded, "Wait waits for the POST under way")
	release()
	require.NoError(t, a.Wait(ctx))
}

// The POSTs under way are bounded: with a hung webhook, an alert raised while 8 are under way is
// logged and counted as a webhook failure rather than starting a ninth.
func TestRaise_PostsUnderWayAreBounded(t *testing.T) {
	t.Parallel()
	url, posted, release := hungWebhook(t)
	a, reg, logs := watchedAlerter(url, hungPostTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for i := range 8 {
		a.Raise(ctx, alert.Alert{Credential: "main", Reason: "retries_exhausted", JobID: fmt.Sprint("j", i)})
	}
	require.Equal(t, 0.0, webhookFailures(t, reg))
	a.Raise(ctx, alert.Alert{Credential: "main", Reason: "retries_exhausted", JobID: "j8"})
	require.Equal(t, 1.0, webhookFailures(t, reg), "the ninth is not posted, and counted")
	require.Contains(t, logs.String(), "posts to the webhook are under way")
	for range 8 {
		select {
		case <-posted:
		case <-ctx.Done():
			t.Fatal("the first 8 alerts never reached the webhook")
		}
	}
	release()
	require.NoError(t, a.Wait(ctx))
	require.Empty(t, posted)
	require.Equal(t, 1.0, webhookFailures(t, reg), "the 8 answered are delivered; the log:\n%s", logs.String())
}

// A Raise may come while a Wait that gave up is still waiting, or after the posts it waited for
// ended (a worker's shutdown that stopped waiting at its deadline, a delivery cut by the
// shutdown that raises after it): that is neither a data race nor a panic ("WaitGroup is reused
// before previous Wait has returned"), and a later Wait waits for the new post.
func TestWait_RaiseAfterAWaitThatGaveUp(t *testing.T) {
	t.Parallel()
	url, posted, release := hungWebhook(t)
	a := alert.New(alert.Config{WebhookURL: url, PostTimeout: hungPostTimeout})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for round := range 20 {
		a.Raise(ctx, alert.Alert{Credential: "main", Reason: "retries_exhausted", JobID: fmt.Sprint("j", round)})
		select {
		case <-posted:
		case <-ctx.Done():
			t.Fatal("the alert never reached the webhook")
		}
		gaveUp, giveUp := context.WithCancel(ctx)
		giveUp()
		err := a.Wait(gaveUp)
		if round == 0 {
			require.ErrorIs(t, err, context.Canceled, "the post is under way")
			release()
		} else if err != nil { // the post may have ended already
			require.ErrorIs(t, err, context.Canceled)
		}
		require.NoError(t, a.Wait(ctx))
	}
}

// A POST the webhook does not answer within PostTimeout ends there: the alert is logged and
// counted as a webhook failure, and Wait returns though the webhook never answers (it is
// released only when the test ends). Whether the post reached the webhook before its timeout is
// the machine's load: not checked. That the bound was the configured one and not the default
// 10 s is told by the deadline the POST carried, not by how soon it ended: a deadline is set
// before the POST is sent, however loaded the machine.
func TestRaise_PostTimeoutEndsAHungPost(t *testing.T) {
	t.Parallel()
	url, _, _ := hungWebhook(t)
	reg, logs := prometheus.NewRegistry(), &logtest.Buffer{}
	spans := make(chan time.Duration, 1)
	a := alert.New(alert.Config{WebhookURL: url, Metrics: alert.NewMetrics(reg),
		Logger: slog.New(slog.NewJSONHandler(logs, nil)), PostTimeout: 100 * time.Millisecond,
		HTTPClient: &http.Client{Transport: deadlineSpan{spans}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	a.Raise(ctx, alert.Alert{Credential: "main", Reason: "retries_exhausted", JobID: "j1"})
	require.NoError(t, a.Wait(ctx), "the post ends at its timeout")
	require.Equal(t, 1.0, webhookFailures(t, reg))
	require.Contains(t, logs.String(), "alert webhook failed")
	select {
	case span := <-spans:
		require.Positive(t, span, "the POST carried no deadline")
		require.LessOrEqual(t, span, 100*time.Millisecond, "the POST's deadline is beyond the configured bound")
	default:
		t.Fatal("no POST was sent")
	}
}

// deadlineSpan is a RoundTripper that sends on spans how far ahead of the request's sending its
// context's deadline was (0 without one), then sends it with http.DefaultTransport.
type deadlineSpan struct{ spans chan<- time.Duration }

func (d deadlineSpan) RoundTrip(r *http.Request) (*http.Response, error) {
	var span time.Duration
	if deadline, ok := r.Context().Deadline(); ok {
		span = time.Until(deadline)
	}
	select {
	case d.spans <- span:
	default:
	}
	return http.DefaultTransport.RoundTrip(r)
}
