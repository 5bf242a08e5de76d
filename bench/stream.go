package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
)

// streamBench is `bench stream`: streaming answers read from the simulator directly, then
// through llmq (submit, then the job's event stream) on several API replicas, first with one
// client per job, then with several. The simulator runs in this process and stamps each token
// as it flushes it, and each client stamps each delta event as it reads it, on the same clock:
// so the delta path's own latency (provider → worker → Redis → API → client) is measured per
// token, apart from the queue's pick-up.
type streamBench struct {
	s            *shared
	apis         int
	clients      int
	tokens       int
	tps          float64
	maxStreams   int
	poolConns    int
	redisServer  string
	steady       time.Duration
	poll         time.Duration
	deltaSpacing string // streaming.delta_spacing; empty: the default
	serve        bool
	gomaxprocs   int

	sim        *simRecorder
	runID      string
	direct     []time.Duration // POST to the simulator → its first content_block_delta, read
	directSim  []time.Duration // the simulator's own time to first token for those calls
	directRead delivery        // what the direct readers got
	phases     []*streamPhase  // the jobs submitted at once: one client each, then the fan-out
	steadyRun  *streamPhase    // the jobs that arrived evenly (nil with -steady 0)
	// steadyFanOut is the steady phase again with -clients clients per job (nil with -steady 0
	// or -clients 1): as many clients at once as the fan-out's, on as many streams, none of it a
	// burst.
	steadyFanOut *streamPhase
	// steadyStages are where the steady phase's deliveries and submits spent their time, from the
	// processes' metrics (nil: not read).
	steadyStages []stageTime
}

// streamPhase is n jobs submitted at once or one every spacing, each followed by clients event
// streams.
type streamPhase struct {
	name    string
	clients int
	spacing time.Duration // between two submits; 0: all at once
	jobs    []*streamJob
	elapsed time.Duration
	load    loadSample
}

// streamJob is one job of a phase: its marker (the simulator's key), its submit time and what
// each of its clients read.
type streamJob struct {
	marker    string
	submitted time.Time
	views     []*jobView
}

func (b *streamBench) flags(fs *flagSet, s *shared) {
	s.base(fs, 2)
	s.jobs(fs, 200, "streaming jobs of each phase, submitted at once")
	s.deadline(fs, 2*time.Minute, "cap on each phase")
	fs.intAtLeast(&b.apis, "apis", 2, 1, "API replicas; jobs are submitted round robin and followed on another replica")
	fs.intAtLeast(&b.clients, "clients", 5, 1, "event-stream clients per job in the fan-out phase and the steady fan-out phase (1: no steady fan-out), spread over the replicas")
	fs.intAtLeast(&b.tokens, "reply-tokens", 100, 1, "tokens of each streamed answer")
	fs.positiveFloat(&b.tps, "tps", 50, "the simulator's tokens per second")
	fs.intAtLeast(&b.maxStreams, "max-streams", 5000, 1, "api.max_streams_per_tenant (every job is the anonymous tenant's; the default, 100, would refuse the fan-out, and on a saturated machine the steady fan-out holds far more than -n streams at once)")
	fs.intAtLeast(&b.poolConns, "pool-max-conns", 0, 0, "each process's Postgres pool (pool_max_conns in the database URL); 0: llmq's default, 16")
	fs.DurationVar(&b.steady, "steady", 10*time.Second, "length of the steady phase: jobs arrive evenly, so many that -n stream at once (0: no steady phase)")
	fs.StringVar(&b.deltaSpacing, "delta-spacing", "", "streaming.delta_spacing (a piece sent sooner than this after a stream's last write waits for the next tick and merges with what follows, e.g. 40ms); empty: llmq's default")
	fs.DurationVar(&b.poll, "poll-interval", 0, "worker.poll_interval (how often an idle worker looks for a job it was not woken for); 0: llmq's default")
	fs.intAtLeast(&b.gomaxprocs, "gomaxprocs", 0, 0, "GOMAXPROCS of each llmq process (0: Go's default, the machine's cores)")
	fs.BoolVar(&b.serve, "serve", false, "run -workers `llmq serve` processes (each an API replica and a worker; -apis is ignored) instead of API replicas and workers apart; their CPU is the workers' column")
	fs.StringVar(&b.redisServer, "redis-server", "redis-server", "redis-server binary: the run starts a private one, so that its INFO counts only llmq")
	b.s = s
}

func (b *streamBench) run(ctx context.Context, log logf) error {
	if b.steady >= b.s.timeout {
		return fmt.Errorf("-steady %s: must be shorter than -timeout %s, the cap on each phase", b.steady, b.s.timeout)
	}
	if err := b.s.binaries(ctx, log); err != nil {
		return err
	}
	redisURL, stopRedis, err := startPrivateRedis(ctx, b.redisServer)
	if err != nil {
		return err
	}
	defer stopRedis()
	b.runID = randHex(4)
	b.sim = newSimRecorder(llmsim.New(llmsim.Config{ReplyTokens: b.tokens, StreamTokensPerSecond: b.tps}))
	sim := httptest.NewServer(b.sim)
	defer sim.Close()
	d, err := deploy(ctx, deployOpts{adminURL: b.s.dbURL, redisURL: redisURL, simURL: sim.URL})
	if err != nil {
		return err
	}
	defer d.close(b.s.keepLogs, log)
	if err := streamConfig(d.cfgPath, b.maxStreams, b.poolConns, b.poll, b.deltaSpacing); err != nil {
		return err
	}
	stackCfg := d.stack(b.s.bin, redisURL)
	stackCfg.metrics = true // the steady phase's stages (steadyStagesNote)
	stackCfg.serve = b.serve
	stackCfg.gomaxprocs = b.gomaxprocs
	st, err := startStack(ctx, stackCfg, b.s.workers)
	if err != nil {
		return err
	}
	defer func() {
		if err := st.stop(); err != nil {
			log("  stopping llmq: %v", err)
		}
	}()
	apiURLs, apiPIDs, stopAPIs, err := b.moreAPIs(ctx, st, redisURL, d.queue)
	defer stopAPIs()
	if err != nil {
		return err
	}
	_, rdb, err := redisFor(ctx, redisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: b.s.n * (b.clients + 1)}}
	defer hc.CloseIdleConnections()

	log("%d streaming calls to the simulator at once", b.s.n)
	if err := b.directCalls(ctx, hc, sim.URL, d.apiKey); err != nil {
		return fmt.Errorf("direct: %w", err)
	}
	sample := func(ctx context.Context) (loadSample, error) { return sampleLoad(ctx, rdb, apiPIDs, st.workerPIDs()) }
	// Warm-up, not reported: the first jobs of a fresh stack pay for its connections and the
	// limiter's first look at the credential.
	if _, err := b.phase(ctx, hc, apiURLs, "warm-up", 4*b.apis, 1, 0, sample); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	for _, ph := range []struct {
		name    string
		clients int
	}{{"one client per job", 1}, {fmt.Sprintf("%d clients per job", b.clients), b.clients}} {
		log("%d streaming jobs through llmq at once, %s, %d API replicas, %d workers", b.s.n, ph.name, b.apis, b.s.workers)
		p, err := b.phase(ctx, hc, apiURLs, ph.name, b.s.n, ph.clients, 0, sample)
		if err != nil {
			return fmt.Errorf("%s: %w", ph.name, err)
		}
		b.phases = append(b.phases, p)
	}
	if b.steady > 0 {
		spacing, jobs := b.steadyArrivals()
		log("%d streaming jobs through llmq, one every %s (%d streams at once), one client per job", jobs, spacing, b.s.n)
		// The workers' delivery stages and the APIs' submit stages over the phase.
		addrs := stageAddrs(st, apiURLs)
		stages0, serr := scrapeStageTotals(ctx, hc, addrs)
		p, err := b.phase(ctx, hc, apiURLs, steadyPhase, jobs, 1, spacing, sample)
		if err != nil {
			return fmt.Errorf("steady: %w", err)
		}
		b.steadyRun = p
		var stages1 map[string]stageTotal
		if serr == nil {
			stages1, serr = scrapeStageTotals(ctx, hc, addrs)
		}
		if serr != nil {
			log("  stages not read: %v", serr)
		} else {
			b.steadyStages = stageTimes(stages0, stages1)
		}
		if b.clients > 1 {
			name := fmt.Sprintf("steady, %d clients per job", b.clients)
			log("%d streaming jobs through llmq, one every %s (%d streams at once), %d clients per job", jobs, spacing, b.s.n, b.clients)
			if b.steadyFanOut, err = b.phase(ctx, hc, apiURLs, name, jobs, b.clients, spacing, sample); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	return nil
}

// steadyPhase names the phase whose jobs arrive evenly.
const steadyPhase = "steady"

// steadyArrivals is the steady phase's spacing between submits, such that -n streams run at
// once (a stream lasts reply-tokens / tps), and its number of jobs.
func (b *streamBench) steadyArrivals() (time.Duration, int) {
	stream := time.Duration(float64(b.tokens) / b.tps * float64(time.Second))
	spacing := max(stream/time.Duration(b.s.n), time.Microsecond)
	return spacing, max(1, int(b.steady/spacing))
}

// streamConfig sets api.max_streams_per_tenant in the bench's config file and, when pool and
// poll are not 0, the processes' Postgres pool size and the workers' poll interval, and when
// spacing is not empty, streaming.delta_spacing.
func streamConfig(path string, n, pool int, poll time.Duration, spacing string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read bench config: %w", err)
	}
	const api = "api: { allow_anonymous: true }"
	if !bytes.Contains(raw, []byte(api)) {
		return errors.New("bench config: no api line to raise max_streams_per_tenant on")
	}
	raw = bytes.Replace(raw, []byte(api), fmt.Appendf(nil, "api: { allow_anonymous: true, max_streams_per_tenant: %d }", n), 1)
	if pool > 0 {
		const db = "sslmode=disable\""
		if !bytes.Contains(raw, []byte(db)) {
			return errors.New("bench config: no database URL to set pool_max_conns on")
		}
		raw = bytes.Replace(raw, []byte(db), fmt.Appendf(nil, "sslmode=disable&pool_max_conns=%d\"", pool), 1)
	}
	if poll > 0 {
		const worker = `metrics_listen: "off"`
		if !bytes.Contains(raw, []byte(worker)) {
			return errors.New("bench config: no worker line to set poll_interval on")
		}
		raw = bytes.Replace(raw, []byte(worker), fmt.Appendf(nil, "%s, poll_interval: %s", worker, poll), 1)
	}
	if spacing != "" {
		raw = fmt.Appendf(raw, "streaming: { delta_spacing: %s }\n", spacing)
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		return fmt.Errorf("write bench config: %w", err)
	}
	_, err = config.LoadWithoutSecrets(path, func(string) string { return "" })
	return err
}

// moreAPIs starts the replicas beyond the stack's API and returns every replica's URL and pid;
// stop stops those it started (call it even on an error). With -serve the stack's processes are
// the replicas, and no pid is returned (their CPU is the workers').
func (b *streamBench) moreAPIs(ctx context.Context, st *stack, redisURL, queue string) (urls []string, pids []int, stop func(), err error) {
	if st.cfg.serve {
		// Every serve process is a replica; their CPU is counted once, as the workers'.
		b.apis = len(st.apiURLs)
		return st.apiURLs, nil, func() {}, nil
	}
	urls, pids = []string{st.apiURL}, []int{st.api.pid()}
	var procs []*proc
	stop = func() { _ = stopAll(procs) }
	for i := 2; i <= b.apis; i++ {
		addr, err := freeAddr()
		if err != nil {
			return nil, nil, stop, err
		}
		p, err := startProc(filepath.Join(st.cfg.bin, "api"), fmt.Sprintf("api-%d", i), st.cfg.logDir, st.env,
			"--config", st.cfg.configPath, "--listen", addr)
		if err != nil {
			return nil, nil, stop, err
		}
		procs = append(procs, p)
		urls, pids = append(urls, "http://"+addr), append(pids, p.pid())
	}
	return urls, pids, stop, waitReady(ctx, redisURL, queue, urls, nil, func() error {
		for _, p := range procs {
			if err := p.exited(); err != nil {
				return err
			}
		}
		return nil
	})
}

// streamRequest is a streaming Messages request whose prompt carries marker.
func streamRequest(marker string) []byte {
	return fmt.Appendf(nil, `{"model":"bench","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"stream %s"}]}`, marker)
}

// directCalls streams n answers from the simulator at once, recording the time to each one's
// first content delta as read and as the simulator sent it, and what each reader got.
func (b *streamBench) directCalls(ctx context.Context, hc *http.Client, simURL, key string) error {
	ctx, cancel := context.WithTimeout(ctx, b.s.timeout)
	defer cancel()
	b.direct = make([]time.Duration, b.s.n)
	views := make([]*jobView, b.s.n)
	errs := make([]error, b.s.n)
	var wg sync.WaitGroup
	for i := range b.s.n {
		wg.Go(func() {
			b.direct[i], views[i], errs[i] = directCall(ctx, hc, simURL, key, fmt.Sprintf("%s-direct-%d", b.runID, i))
		})
	}
	wg.Wait()
	for i, v := range views {
		c, _ := b.sim.call(fmt.Sprintf("%s-direct-%d", b.runID, i))
		if c == nil || v == nil {
			continue
		}
		if d, ok := c.firstToken(); ok {
			b.directSim = append(b.directSim, d)
		}
		text, ends, at := c.snapshot()
		b.directRead.add(text, ends, at, v)
	}
	return errors.Join(errs...)
}

// directCall streams one answer and returns the time to its first content delta and the
// deltas read, stamped; it reads the stream to its end.
func directCall(ctx context.Context, hc *http.Client, simURL, key, marker string) (time.Duration, *jobView, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, simURL+"/v1/messages", bytes.NewReader(streamRequest(marker)))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("x-api-key", key)
	req.Header.Set("anthropic-version", "2023-06-01")
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("simulator answered %d", resp.StatusCode)
	}
	v := &jobView{opened: time.Now()}
	rd := bufio.NewReader(resp.Body)
	delta := false
	for {
		line, err := rd.ReadString('\n')
		if errors.Is(err, io.EOF) && !v.firstDelta.IsZero() {
			return v.firstDelta.Sub(start), v, nil
		}
		if err != nil {
			return 0, v, fmt.Errorf("simulator stream: %w", err)
		}
		switch {
		case strings.HasPrefix(line, "event: "):
			delta = line == "event: content_block_delta\n"
		case delta && strings.HasPrefix(line, "data: "):
			var d struct {
				Delta struct {
					Text string `json:"text"`
				} `json:"delta"`
			}
			if err := json.Unmarshal([]byte(line[len("data: "):]), &d); err != nil {
				return 0, v, fmt.Errorf("content delta: %w", err)
			}
			v.delta(len(v.text), d.Delta.Text, time.Now())
		}
	}
}

// phase submits n jobs, at once (spacing 0) or one every spacing, round robin over the replicas,
// and follows each with clients event streams on the other replicas; sample brackets it with
// the resources used.
func (b *streamBench) phase(ctx context.Context, hc *http.Client, apiURLs []string, name string, n, clients int,
	spacing time.Duration, sample func(context.Context) (loadSample, error)) (*streamPhase, error) {
	ctx, cancel := context.WithTimeout(ctx, b.s.timeout)
	defer cancel()
	p := &streamPhase{name: name, clients: clients, spacing: spacing, jobs: make([]*streamJob, n)}
	before, err := sample(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		p.jobs[i] = &streamJob{marker: fmt.Sprintf("%s-%s-%d", b.runID, name, i)}
	}
	for i := range n {
		if spacing > 0 && !sleepUntil(ctx, start.Add(time.Duration(i)*spacing)) {
			errs[i] = ctx.Err()
			break
		}
		wg.Go(func() { errs[i] = p.jobs[i].run(ctx, hc, apiURLs, i, clients) })
	}
	wg.Wait()
	p.elapsed = time.Since(start)
	after, err := sample(ctx)
	if err != nil {
		return nil, err
	}
	p.load = after.sub(before)
	return p, errors.Join(errs...)
}

// run submits job i to replica i and follows it with clients streams on replicas i+1, i+2, ...
func (j *streamJob) run(ctx context.Context, hc *http.Client, apiURLs []string, i, clients int) error {
	j.submitted = time.Now()
	a, err := submitJob(ctx, hc, apiURLs[i%len(apiURLs)], i, jobBody(streamRequest(j.marker), 3, time.Minute))
	if err != nil {
		return err
	}
	id := a.id()
	j.views = make([]*jobView, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() { j.views[c], errs[c] = follow(ctx, hc, apiURLs[(i+1+c)%len(apiURLs)], id) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
