package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/credstate"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/limiter"
)

func (a *app) credentialsCommand() *cli.Command {
	return &cli.Command{
		Name:  "credentials",
		Usage: "inspect provider credentials (limits in force, pauses, Retry-After push-backs) and resume one",
		Subcommands: []*cli.Command{{
			Name:  "list",
			Usage: "each credential's limit (configured or learned), token limits (input and output tokens per minute), pause state and Retry-After push-back",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
			Action: func(c *cli.Context) error {
				if c.NArg() != 0 {
					return cli.Exit("usage: ctl credentials list [--json]", exitUsage)
				}
				cfg, lim, brk, closeFn, err := credentialState(c)
				if err != nil {
					return err
				}
				defer closeFn()
				// Postgres keeps the pauses: a pause Redis lost is read (and restored) from there.
				// The pool connects only then, so the list does not need Postgres otherwise.
				u, err := databaseURL(c)
				if err != nil {
					return err
				}
				p, err := a.boundedPool(c, u)
				if err != nil {
					return err
				}
				defer p.Close()
				pauses := credpause.NewStore(p, nil)
				type row struct {
					Name     string `json:"name"`
					Provider string `json:"provider"`
					credstate.State
				}
				var rows []row
				for _, cr := range cfg.Credentials {
					var configured limiter.Limit
					if cr.Limits != nil {
						configured = limiter.Limit{Rate: cr.Limits.RequestsPerSecond, Burst: cr.Limits.Burst}
					}
					st, err := credstate.Read(c.Context, lim.Gate(cr.LimiterID(), cr.Name), brk.Circuit(cr.LimiterID(), cr.Name), configured, pauses)
					if err != nil {
						return unreachable(err) // Postgres, for a pause Redis lost
					}
					rows = append(rows, row{Name: cr.Name, Provider: cr.Provider, State: st})
				}
				return printList(a.out, c.Bool("json"), rows, "", "NAME\tPROVIDER\tLIMIT\tSOURCE\tTOKEN LIMITS\tPAUSED\tPUSHED BACK\tBREAKER", func(r row) []string {
					limit := "-"
					if r.Burst > 0 || r.RatePerSec > 0 {
						limit = fmt.Sprintf("%.4g/s burst %d", r.RatePerSec, r.Burst)
					}
					// As the console's credentials page: "input 40000/min (learned), ...".
					tokenLimits := "-"
					if len(r.TokenLimits) > 0 {
						parts := make([]string, len(r.TokenLimits))
						for i, tl := range r.TokenLimits {
							parts[i] = fmt.Sprintf("%s %s/min (%s)", tl.Bucket,
								strconv.FormatFloat(tl.PerMinute, 'f', -1, 64), tl.Source)
						}
						tokenLimits = strings.Join(parts, ", ")
					}
					paused := "no"
					if r.Paused {
						paused = fmt.Sprintf("since %s (%s, first job %s)", r.PausedSince.Format(time.RFC3339), r.PauseReason, r.FirstJobID)
					}
					pushed := "no"
					if r.PushedBack != nil {
						pushed = fmt.Sprintf("until %s (%s)", r.PushedBack.Format(time.RFC3339), r.PushReason)
					}
					brkState := r.Breaker
					if r.BreakerTill != nil {
						brkState += " until " + r.BreakerTill.Format(time.RFC3339)
					}
					return []string{r.Name, r.Provider, limit, r.LimitSource, tokenLimits, paused, pushed, brkState}
				})
			},
		}, {
			Name:      "resume",
			Usage:     "resume a credential: end its pause (a spend cap: 429 without Retry-After) and its Retry-After push-back",
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
					return cli.Exit(fmt.Sprintf("no credential %q in the config", c.Args().First()), exitUsage)
				}
				// Postgres before the change: a resume the audit log cannot record is not made.
				p, err := a.pool(c)
				if err != nil {
					return err
				}
				defer p.Close()
				gate := lim.Gate(cr.LimiterID(), cr.Name)
				// Postgres keeps the pause too, so that it survives Redis losing its data.
				was, err := credpause.NewStore(p, nil).Resume(c.Context, gate)
				if err != nil {
					return err
				}
				pb, err := gate.ClearPushBack(c.Context)
				if err != nil {
					return err
				}
				if !was && !pb.Active() {
					fmt.Fprintf(a.out, "credential %s was neither paused nor pushed back\n", cr.Name)
					return nil
				}
				if pb.Active() {
					// Jobs already given a send time at the push-back's end keep it: at most
					// retry.max_retry_after away.
					fmt.Fprintf(a.out, "credential %s resumed: cleared its push-back until %s (%s)\n", cr.Name,
						pb.Until.UTC().Format(time.RFC3339), pb.Reason())
				} else {
					fmt.Fprintf(a.out, "credential %s resumed\n", cr.Name)
				}
				return logAction(c.Context, p, audit.Entry{Action: "credential.resume", Target: cr.Name, Count: 1})
			},
		}},
	}
}

// credentialState loads the config (required: credentials and their keys live there) and opens
// the shared limiter and breaker on its Redis.
func credentialState(c *cli.Context) (*config.Config, *limiter.Limiter, *breaker.Breaker, func(), error) {
	p := c.String("config")
	if p == "" {
		return nil, nil, nil, nil, cli.Exit("credentials commands need --config (or LLMQ_CONFIG): credentials are defined there", exitUsage)
	}
	cfg, err := config.Load(p, nil)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if u := c.String("redis-url"); u != "" {
		cfg.RedisURL = u // the flag overrides the file, as for every command
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
