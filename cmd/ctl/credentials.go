package main

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/limiter"
)

func (a *app) credentialsCommand() *cli.Command {
	return &cli.Command{
		Name:  "credentials",
		Usage: "inspect provider credentials: limits in force, pauses",
		Subcommands: []*cli.Command{{
			Name:  "list",
			Usage: "each credential's limit (configured or learned) and pause state",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
			Action: func(c *cli.Context) error {
				cfg, lim, brk, closeFn, err := credentialState(c)
				if err != nil {
					return err
				}
				defer closeFn()
				type row struct {
					Name        string     `json:"name"`
					Provider    string     `json:"provider"`
					Source      string     `json:"limit_source"`
					RatePerSec  float64    `json:"requests_per_second"`
					Burst       int        `json:"burst"`
					Paused      bool       `json:"paused"`
					PausedSince *time.Time `json:"paused_since,omitempty"`
					PauseReason string     `json:"pause_reason,omitempty"`
					FirstJobID  string     `json:"pause_first_job_id,omitempty"`
					Breaker     string     `json:"breaker"`
					BreakerTill *time.Time `json:"breaker_until,omitempty"`
				}
				var rows []row
				for _, cr := range cfg.Credentials {
					lc := lim.Gate(cr.LimiterID(), cr.Name)
					l, src, err := lc.Current(c.Context)
					if err != nil {
						return err
					}
					if cr.Limits != nil && src == limiter.SourceUnknown {
						// No worker has reserved yet; the configured limit is what will apply.
						l, src = limiter.Limit{Rate: cr.Limits.RequestsPerSecond, Burst: cr.Limits.Burst}, limiter.SourceConfigured
					}
					ps, err := lc.Paused(c.Context)
					if err != nil {
						return err
					}
					bs, err := brk.Circuit(cr.LimiterID(), cr.Name).Status(c.Context)
					if err != nil {
						return err
					}
					r := row{Name: cr.Name, Provider: cr.Provider, Source: string(src), RatePerSec: l.Rate, Burst: l.Burst,
						Paused: ps.Paused, Breaker: string(bs.State)}
					if bs.State != breaker.Closed && !bs.Until.IsZero() {
						until := bs.Until
						r.BreakerTill = &until
					}
					if ps.Paused {
						since := ps.Since
						r.PausedSince, r.PauseReason, r.FirstJobID = &since, ps.Reason, ps.FirstJobID
					}
					rows = append(rows, r)
				}
				if c.Bool("json") {
					return writeJSON(a.out, rows)
				}
				tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tPROVIDER\tLIMIT\tSOURCE\tPAUSED\tBREAKER")
				for _, r := range rows {
					limit := "-"
					if r.Burst > 0 || r.RatePerSec > 0 {
						limit = fmt.Sprintf("%.4g/s burst %d", r.RatePerSec, r.Burst)
					}
					paused := "no"
					if r.Paused {
						paused = fmt.Sprintf("since %s (%s, first job %s)", r.PausedSince.Format(time.RFC3339), r.PauseReason, r.FirstJobID)
					}
					brkState := r.Breaker
					if r.BreakerTill != nil {
						brkState += " until " + r.BreakerTill.Format(time.RFC3339)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.Provider, limit, r.Source, paused, brkState)
				}
				return tw.Flush()
			},
		}, {
			Name:      "resume",
			Usage:     "resume a credential paused by a spend cap (429 without Retry-After)",
			ArgsUsage: "NAME",
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return cli.Exit("usage: ctl credentials resume NAME", 2)
				}
				cfg, lim, _, closeFn, err := credentialState(c)
				if err != nil {
					return err
				}
				defer closeFn()
				cr, ok := cfg.Credential(c.Args().First())
				if !ok {
					return fmt.Errorf("no credential %q in the config", c.Args().First())
				}
				was, err := lim.Gate(cr.LimiterID(), cr.Name).Resume(c.Context)
				if err != nil {
					return err
				}
				if !was {
					fmt.Fprintf(a.out, "credential %s was not paused\n", cr.Name)
					return nil
				}
				fmt.Fprintf(a.out, "credential %s resumed\n", cr.Name)
				return nil
			},
		}},
	}
}

// credentialState loads the config (required: credentials and their keys live there) and opens
// the shared limiter and breaker on its Redis.
func credentialState(c *cli.Context) (*config.Config, *limiter.Limiter, *breaker.Breaker, func(), error) {
	p := c.String("config")
	if p == "" {
		return nil, nil, nil, nil, errors.New("credentials commands need --config (or LLMQ_CONFIG): credentials are defined there")
	}
	cfg, err := config.Load(p, nil)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	opt, err := dispatch.RedisConnOpt(cfg.RedisURL)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	rdb := dispatch.NewRedisClient(opt)
	fail := func(err error) (*config.Config, *limiter.Limiter, *breaker.Breaker, func(), error) {
		rdb.Close()
		return nil, nil, nil, nil, err
	}
	if err := rdb.Ping(c.Context).Err(); err != nil {
		return fail(fmt.Errorf("redis unreachable: %w", err))
	}
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: c.String("redis-prefix")})
	if err != nil {
		return fail(err)
	}
	brk, err := breaker.New(rdb, &breaker.Config{Prefix: c.String("redis-prefix")})
	if err != nil {
		return fail(err)
	}
	return cfg, lim, brk, func() { rdb.Close() }, nil
}
