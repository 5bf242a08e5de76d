package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/config"
)

// llmqSetup is what a run sets in llmq's config beyond its stores, queue and simulator.
type llmqSetup struct {
	limits  *config.Limits  // the credential's limits; nil: learned from the provider
	breaker *config.Breaker // the breaker block; nil: llmq's defaults
	// tokenMinute is worker.token_minute (the provider's token "minute"); 0: llmq's default.
	tokenMinute time.Duration
	// workers is the number of worker processes; 0: the -workers flag.
	workers int
	// retention is the retention block; nil: llmq's defaults.
	retention *retentionSetup
	// batch is the credential's batch block, e.g. "{ enabled: true }"; "": none.
	batch string
}

// retentionSetup is a run's retention block: off, or llmq's default periods with the passes
// interval apart.
type retentionSetup struct {
	off      bool          // every final status kept forever
	interval time.Duration // retention.interval; 0: llmq's default
}

// yaml is the retention block's line of the config.
func (r retentionSetup) yaml() string {
	var fields []string
	if r.off {
		fields = append(fields, "succeeded: off, failed: off, canceled: off, dead: off")
	}
	if r.interval > 0 {
		fields = append(fields, "interval: "+r.interval.String())
	}
	if len(fields) == 0 {
		return ""
	}
	return "retention: { " + strings.Join(fields, ", ") + " }\n"
}

// deployment is what one run of llmq needs besides its processes: a directory for the config
// and the logs, a fresh database, a fresh queue, and the config that names them with the
// simulator as the credential's provider.
type deployment struct {
	dir     string
	dbName  string
	dbURL   string // the database, directly
	queue   string
	cfgPath string
	cfg     *config.Config
	apiKey  string
	// rewrite writes the config again with another setup, for the processes started next.
	rewrite func(llmqSetup) error
	c       cleanups
}

// deployOpts says where a deployment's stores and provider are.
type deployOpts struct {
	adminURL string // the Postgres server; the database is created there
	redisURL string
	// dbHost, when set, is the host:port through which llmq reaches the database (a proxy).
	dbHost string
	simURL string
	setup  llmqSetup
}

// deploy creates a deployment. Its close removes everything it created.
func deploy(ctx context.Context, o deployOpts) (*deployment, error) {
	d := &deployment{apiKey: "sk-bench-" + randHex(8)}
	if err := d.create(ctx, o); err != nil {
		d.close(false, nil)
		return nil, err
	}
	return d, nil
}

func (d *deployment) create(ctx context.Context, o deployOpts) error {
	suffix := randHex(6)
	var err error
	if d.dir, err = os.MkdirTemp("", "llmq-bench-"); err != nil {
		return fmt.Errorf("create temp dir: %w", err)
	}
	d.dbName, d.queue = "llmq_bench_"+suffix, "llmq-bench-"+suffix
	dbURL, drop, err := createDatabase(ctx, o.adminURL, d.dbName)
	if err != nil {
		return err
	}
	d.c.add(drop)
	d.dbURL = dbURL
	cfgDB := dbURL
	if o.dbHost != "" {
		u, err := url.Parse(dbURL)
		if err != nil {
			return fmt.Errorf("parse database url: %w", err)
		}
		u.Host = o.dbHost
		cfgDB = u.String()
	}
	d.cfgPath = filepath.Join(d.dir, "llmq.yaml")
	d.rewrite = func(setup llmqSetup) error {
		cfg, err := writeConfig(d.cfgPath, cfgDB, o.redisURL, d.queue, o.simURL, d.apiKey, setup)
		if err == nil {
			d.cfg = cfg
		}
		return err
	}
	if err := d.rewrite(o.setup); err != nil {
		return err
	}
	d.c.add(func() { cleanLLMQRedis(o.redisURL, d.queue, d.cfg.Credentials[0].LimiterID()) })
	return nil
}

// stack is the config of the deployment's processes.
func (d *deployment) stack(bin, redisURL string) stackConfig {
	return stackConfig{bin: bin, configPath: d.cfgPath, logDir: d.dir, apiKey: d.apiKey, redisURL: redisURL, queue: d.queue}
}

// close removes what the deployment created; the config and logs are kept (and their
// directory logged) when keep is set.
func (d *deployment) close(keep bool, log logf) {
	d.c.run()
	if keep && log != nil {
		log("config and logs kept in %s", d.dir)
		return
	}
	if d.dir != "" {
		_ = os.RemoveAll(d.dir)
	}
}

// writeConfig writes llmq's config for one run and returns it as the programs will load it.
// The simulator's key is referenced through simKeyEnv; the file is validated with the real
// loader before any process starts.
func writeConfig(path, dbURL, redisURL, queue, simURL, apiKey string, s llmqSetup) (*config.Config, error) {
	limits, breaker, worker, retention := "", "", "", ""
	if l := s.limits; l != nil {
		var toks string
		for _, f := range []struct {
			key string
			v   float64
		}{{"input_tokens_per_minute", l.InputTokensPerMinute}, {"output_tokens_per_minute", l.OutputTokensPerMinute}, {"tokens_per_minute", l.TokensPerMinute}} {
			if f.v > 0 {
				toks += fmt.Sprintf(", %s: %g", f.key, f.v)
			}
		}
		limits = fmt.Sprintf("\n    limits: { requests_per_second: %g, burst: %d%s }", l.RequestsPerSecond, l.Burst, toks)
	}
	if s.tokenMinute > 0 {
		worker = ", token_minute: " + s.tokenMinute.String()
	}
	if b := s.breaker; b != nil {
		maxCooldown := ""
		if b.MaxCooldown > 0 {
			maxCooldown = fmt.Sprintf(", max_cooldown: %s", b.MaxCooldown)
		}
		breaker = fmt.Sprintf("breaker: { threshold: %d, cooldown: %s%s, cold_start_cap: %t }\n", b.Threshold, b.Cooldown, maxCooldown, b.ColdStart())
	}
	if s.retention != nil {
		retention = s.retention.yaml()
	}
	if s.batch != "" {
		limits += "\n    batch: " + s.batch
	}
	yaml := fmt.Sprintf(`# Written by the bench for one run; removed afterwards.
database_url: %q
redis_url: %q
api: { allow_anonymous: true }
worker: { queue: %q, metrics_listen: "off"%s }
%s%scredentials:
  - name: default
    provider: anthropic
    base_url: %q
    api_key_env: %s%s
`, dbURL, redisURL, queue, worker, breaker, retention, simURL, simKeyEnv, limits)
	cfg, err := config.Parse([]byte(yaml), func(k string) string {
		if k == simKeyEnv {
			return apiKey
		}
		return ""
	})
	if err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		return nil, fmt.Errorf("write config: %w", err)
	}
	return cfg, nil
}

// cleanups runs functions in reverse order of registration, once.
type cleanups struct{ fns []func() }

func (c *cleanups) add(f func()) { c.fns = append(c.fns, f) }

func (c *cleanups) run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}
