package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/offboard"
	"github.com/llmq/llmq/internal/pgerr"
	"github.com/llmq/llmq/internal/tenant"
)

func (a *app) tenantsCommand() *cli.Command {
	return &cli.Command{
		Name:  "tenants",
		Usage: "manage API tenants and their bearer tokens",
		Subcommands: []*cli.Command{{
			Name:      "create",
			Usage:     "create a tenant and print its bearer token (shown once: only its SHA-256 is stored)",
			ArgsUsage: "NAME",
			Flags: []cli.Flag{&cli.StringFlag{Name: "credentials",
				Usage: "comma-separated credentials the tenant's jobs may use (default: all); checked against --config when given"},
				weightFlag(tenant.DefaultWeight)},
			Action: func(c *cli.Context) error {
				name, raw, set, err := createArgs(c)
				if err != nil {
					return err
				}
				creds, err := credentialList(c, raw, set)
				if err != nil {
					return err
				}
				p, err := a.pool(c)
				if err != nil {
					return err
				}
				defer p.Close()
				t, token, err := tenant.NewStore(p, nil).CreateWeighted(c.Context, name, creds, c.Int("weight"))
				if err != nil {
					return err
				}
				// The token alone on the output (TOKEN=$(ctl tenants create NAME)); the notice on
				// the error output.
				fmt.Fprintf(a.errOut, "tenant %s created (credentials: %s), weight %d; its bearer token follows and is not shown again:\n",
					t.Name, credentialsText(t.Credentials), t.Weight)
				fmt.Fprintln(a.out, token)
				return logAction(c.Context, p, audit.Entry{Action: "tenant.create", Target: t.Name, Count: 1,
					Detail: map[string]any{"credentials": t.Credentials, "weight": t.Weight}})
			},
		}, {
			Name:      "revoke",
			Usage:     "revoke a tenant's token: the API answers it 403 (within a few seconds on every replica)",
			ArgsUsage: "NAME [--cancel-jobs]",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "cancel-jobs",
				Usage: "also cancel every job of the tenant that has not ended (aborting calls in flight), those submitted while the revocation reaches every API replica too, " +
					"and its dead letters (which no 'ctl dead retry' then sends)"}},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return cli.Exit("usage: ctl tenants revoke NAME [--cancel-jobs]", exitUsage)
				}
				var tasks *ctlTasks
				if c.Bool("cancel-jobs") {
					// Redis before the change, as Postgres: a revocation whose jobs cannot be
					// canceled is not made.
					var closeTasks func()
					var err error
					if tasks, closeTasks, err = a.openTasks(c); err != nil {
						return err
					}
					defer closeTasks()
				}
				p, err := a.pool(c)
				if err != nil {
					return err
				}
				defer p.Close()
				name := c.Args().First()
				tenants := tenant.NewStore(p, nil)
				wasActive, err := tenants.Revoke(c.Context, name)
				if err != nil {
					return err
				}
				if !wasActive {
					fmt.Fprintf(a.out, "tenant %s was revoked already\n", name)
				} else {
					fmt.Fprintf(a.out, "tenant %s revoked\n", name)
					if err := logAction(c.Context, p, audit.Entry{Action: "tenant.revoke", Target: name, Count: 1}); err != nil {
						return err
					}
				}
				if tasks == nil {
					return nil
				}
				// The last walk comes once the replicas' caches have let go of the revocation (at
				// once for a tenant revoked long ago); its dead letters too, which no retry of the
				// dead letters sends then.
				abort := func(j *jobs.Job) error { return tasks.AbortEnded(c.Context, j) }
				n, dead, err := offboard.CancelJobs(c.Context, tenants, jobs.NewStore(p, nil), name, a.revokeSettle,
					abort, abort)
				if n > 0 || err == nil {
					fmt.Fprintf(a.out, "canceled %d jobs of tenant %s%s\n", n, name, deadLettersNote(dead))
					// Logged even when the command was interrupted: those jobs are canceled.
					ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Context), 5*time.Second)
					defer cancel()
					if lerr := logAction(ctx, p, offboard.CancelJobsEntry(name, n, dead)); err == nil {
						err = lerr
					}
				}
				if errors.Is(err, offboard.ErrIncomplete) {
					// Postgres failed, or the command was interrupted: a second run finds the
					// tenant revoked (neither revoked nor audited again), passes over the jobs
					// canceled so far and cancels the rest.
					return fmt.Errorf("%w; not every job of tenant %s may be canceled: run `ctl tenants revoke %s --cancel-jobs` again", err, name, name)
				}
				return err
			},
		}, {
			Name: "delete",
			Usage: "delete a revoked tenant: cancel its jobs that have not ended, delete every job of it with its attempts, events and idempotency keys, " +
				"then its tokens; the audit log keeps its entries and this deletion, and the name may be given to a new tenant",
			ArgsUsage: "NAME",
			Action:    a.tenantsDelete,
		}, {
			Name: "rotate",
			Usage: "give a tenant a new bearer token and print it (shown once); the old token keeps working for --overlap, then answers 401. " +
				"A token still in an earlier rotation's overlap ends at once",
			ArgsUsage: "NAME [--overlap DURATION]",
			Flags: []cli.Flag{&cli.DurationFlag{Name: "overlap", Value: tenant.DefaultOverlap,
				Usage: fmt.Sprintf("how long the old token keeps working, for its clients to take the new one (0: it ends at once, for a leaked token; at most %s)", tenant.MaxOverlap)}},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return cli.Exit("usage: ctl tenants rotate NAME [--overlap DURATION]", exitUsage)
				}
				overlap := c.Duration("overlap")
				if overlap < 0 || overlap > tenant.MaxOverlap {
					return cli.Exit(fmt.Sprintf("--overlap must be 0..%s", tenant.MaxOverlap), exitUsage)
				}
				p, err := a.pool(c)
				if err != nil {
					return err
				}
				defer p.Close()
				name := c.Args().First()
				r, err := tenant.NewStore(p, nil).Rotate(c.Context, name, overlap)
				if err != nil {
					return err
				}
				// As create: the token alone on the output, the notice on the error output.
				ends := "at once"
				if overlap > 0 {
					ends = "at " + r.PreviousEnds.UTC().Format(time.RFC3339) + " (in " + overlap.String() + ")"
				}
				fmt.Fprintf(a.errOut, "tenant %s: new bearer token; the old one ends %s", name, ends)
				if r.Ended > 0 {
					fmt.Fprintf(a.errOut, ", and the token of the earlier rotation still in its overlap ended now")
				}
				fmt.Fprintln(a.errOut, ". The new token follows and is not shown again:")
				fmt.Fprintln(a.out, r.Token)
				return logAction(c.Context, p, audit.Entry{Action: "tenant.rotate", Target: name, Count: 1,
					Detail: map[string]any{"overlap": overlap.String(), "previous_ends_at": r.PreviousEnds.UTC().Format(time.RFC3339), "ended": r.Ended}})
			},
		}, {
			Name:      "set",
			Usage:     "change a tenant's weight: its share of a credential against other tenants with work (workers apply it within seconds)",
			ArgsUsage: "NAME --weight N",
			Flags:     []cli.Flag{weightFlag(0)},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 || !c.IsSet("weight") {
					return cli.Exit("usage: ctl tenants set NAME --weight N", exitUsage)
				}
				p, err := a.pool(c)
				if err != nil {
					return err
				}
				defer p.Close()
				name, w := c.Args().First(), c.Int("weight")
				if err := tenant.NewStore(p, nil).SetWeight(c.Context, name, w); err != nil {
					return err
				}
				fmt.Fprintf(a.out, "tenant %s: weight %d\n", name, w)
				return logAction(c.Context, p, audit.Entry{Action: "tenant.weight", Target: name, Count: 1,
					Detail: map[string]any{"weight": w}})
			},
		}, {
			Name:  "list",
			Usage: "every tenant, its credentials, whether it is revoked and, during a rotation's overlap, when its old token ends (tokens are not stored, so never shown)",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
			Action: func(c *cli.Context) error {
				if c.NArg() != 0 {
					return cli.Exit("usage: ctl tenants list [--json]", exitUsage)
				}
				p, err := a.pool(c)
				if err != nil {
					return err
				}
				defer p.Close()
				list, err := tenant.NewStore(p, nil).List(c.Context)
				if err != nil {
					return err
				}
				return printList(a.out, c.Bool("json"), list, "no tenants (ctl tenants create NAME)", "NAME\tCREDENTIALS\tWEIGHT\tCREATED\tREVOKED\tOLD TOKEN ENDS", func(t tenant.Tenant) []string {
					return []string{t.Name, credentialsText(t.Credentials), strconv.Itoa(t.Weight), t.CreatedAt.Format(time.RFC3339), ts(t.RevokedAt), ts(t.PreviousTokenEndsAt)}
				})
			},
		}},
	}
}

// tenantDeleteBatch is how many jobs one transaction of `ctl tenants delete` deletes (see
// jobs.Store.DeleteEndedOfTenant); it tells its progress after each.
const tenantDeleteBatch = 500

// tenantsDelete is `ctl tenants delete NAME`: only a revoked tenant. Its jobs that have not
// ended are canceled (their tasks aborted) once the revocation has reached every API replica,
// then its jobs are deleted in batches with their attempts, events and keys, then the tenant and
// its tokens. Jobs left (in a provider batch still open, or being changed) keep the tenant: the
// command says so and fails, and runs again later finish it. Each run is audited, stopped
// halfway or not, with what it did.
func (a *app) tenantsDelete(c *cli.Context) (err error) {
	if c.NArg() != 1 {
		return cli.Exit("usage: ctl tenants delete NAME", exitUsage)
	}
	name := c.Args().First()
	if name == tenant.Default {
		return fmt.Errorf("%w: %q answers anonymous requests as stored (api.allow_anonymous): deleted, they would be let in again", tenant.ErrAnonymousTenant, name)
	}
	// Redis first, as revoke --cancel-jobs: a deletion whose running jobs cannot be stopped is
	// not begun.
	tasks, closeTasks, err := a.openTasks(c)
	if err != nil {
		return err
	}
	defer closeTasks()
	p, err := a.pool(c)
	if err != nil {
		return err
	}
	defer p.Close()
	abort := func(j *jobs.Job) error { return tasks.AbortEnded(c.Context, j) }
	res, err := offboard.DeleteTenant(c.Context, tenant.NewStore(p, nil), jobs.NewStore(p, nil), name, offboard.Options{
		Settle: a.revokeSettle, Abort: abort, AbortInFlight: abort, Batch: tenantDeleteBatch,
		Canceled: func(n int) { fmt.Fprintf(a.out, "canceled %d jobs of tenant %s\n", n, name) },
		Progress: func(deleted int64) { fmt.Fprintf(a.out, "deleted %d jobs so far\n", deleted) },
	})
	defer func() {
		// Logged even when the command was interrupted or failed halfway: what it did is done.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Context), 5*time.Second)
		defer cancel()
		for _, e := range res.AuditEntries(name) {
			if lerr := logAction(ctx, p, e); lerr != nil && err == nil {
				err = lerr
			}
		}
	}()
	switch {
	case errors.Is(err, tenant.ErrNotRevoked):
		return fmt.Errorf("tenant %s is not revoked: only a revoked tenant is deleted (ctl tenants revoke %s --cancel-jobs)", name, name)
	case err != nil && (res.Canceled > 0 || res.Deleted > 0) && a.bound.commitUncertain():
		// Stopped at a COMMIT that got no answer, the tenant's row's perhaps: it may be deleted,
		// and statementHint says how to check.
		return fmt.Errorf("%w; tenant %s may not be deleted (its jobs are canceled): run `ctl tenants delete %s` again if `ctl tenants list` shows it",
			err, name, name)
	case err != nil && (res.Canceled > 0 || res.Deleted > 0):
		// Stopped halfway (an abort that failed stops it before it deletes): what it did stands,
		// and a second run, which finds those jobs ended, goes on.
		return fmt.Errorf("%w; tenant %s not deleted (its jobs are canceled): run `ctl tenants delete %s` again", err, name, name)
	case err != nil && !errors.Is(err, tenant.ErrNotFound) && !errors.Is(err, tenant.ErrAnonymousTenant) &&
		!a.bound.commitUncertain():
		// Failed before anything was changed. Not so after a COMMIT that got no answer (the
		// tenant's row, a tenant without jobs; cut by --timeout, or its connection lost): it may
		// have been deleted, and statementHint says how to check.
		if !passing(err) {
			// A refusal a second run meets again (permission denied, a schema not migrated).
			return fmt.Errorf("%w; tenant %s not deleted (nothing was changed)", err, name)
		}
		// Interrupted, or Postgres unavailable: as halfway, a second run is what to do.
		return fmt.Errorf("%w; tenant %s not deleted (nothing was changed): run `ctl tenants delete %s` again", err, name, name)
	case err != nil:
		return err
	case res.Kept():
		fmt.Fprintf(a.out, "deleted %d jobs of tenant %s\n", res.Deleted, name)
		return fmt.Errorf("tenant %s kept: %d of its jobs are left (%d not ended, %d in a provider batch still open or being changed; "+
			"the batch lane cancels a batch none of whose jobs waits): run `ctl tenants delete %s` again later", name, res.Unfinished+res.Left, res.Unfinished, res.Left, name)
	}
	fmt.Fprintf(a.out, "tenant %s deleted, with %d jobs (their attempts, events and idempotency keys) and its tokens\n", name, res.Deleted)
	return nil
}

// passing reports whether err, a failure of a command that changed nothing, may pass on a
// second run: an interruption (ctx, --timeout), Postgres unavailable (pgerr.Unavailable), a
// transaction rolled back for another's sake (SQLSTATE class 40: a deadlock, a serialization
// failure), a job of the tenant that came meanwhile (tenant.ErrHasJobs: the next run cancels it).
// Any other refusal (permission denied, a schema not migrated) is met again.
func passing(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgerr.Unavailable(err) ||
		(errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "40")) || errors.Is(err, tenant.ErrHasJobs)
}

// createArgs returns the NAME of `tenants create` and its --credentials value (set reports
// whether the flag was given).
func createArgs(c *cli.Context) (name, creds string, set bool, err error) {
	if c.NArg() != 1 {
		return "", "", false, cli.Exit("usage: ctl tenants create NAME [--credentials a,b]", exitUsage)
	}
	return c.Args().First(), c.String("credentials"), c.IsSet("credentials"), nil
}

// credentialList parses the --credentials value (nil when the flag is absent: every credential)
// and, with --config, requires each name to be configured, so a typo does not create a tenant
// that can submit nothing. An empty name among others (two commas in a row, one at an end) is a
// usage error: dropped, a name lost in a typo would leave the tenant without the credential meant.
func credentialList(c *cli.Context, raw string, set bool) ([]string, error) {
	if !set {
		return nil, nil
	}
	if strings.TrimSpace(strings.ReplaceAll(raw, ",", "")) == "" {
		return nil, cli.Exit("--credentials: name at least one credential (omit the flag to allow all)", exitUsage)
	}
	var creds []string
	for _, s := range strings.Split(raw, ",") {
		if s = strings.TrimSpace(s); s == "" {
			return nil, cli.Exit(fmt.Sprintf("--credentials %q: an empty credential name (two commas in a row, or one at an end); "+
				"separate the names with one comma", raw), exitUsage)
		}
		creds = append(creds, s)
	}
	cfg, err := fileConfig(c)
	if err != nil || cfg == nil {
		return creds, err
	}
	var unknown []string
	for _, name := range creds {
		if _, ok := cfg.Credential(name); !ok {
			unknown = append(unknown, fmt.Sprintf("%q", name))
		}
	}
	if len(unknown) > 0 {
		return nil, cli.Exit("--credentials: not in the config: "+strings.Join(unknown, ", "), exitUsage)
	}
	return creds, nil
}

// weightFlag is --weight: a tenant's share of a credential against other tenants with work.
func weightFlag(def int) *cli.IntFlag {
	return &cli.IntFlag{Name: "weight", Value: def,
		Usage: fmt.Sprintf("the tenant's share of a credential against other tenants with work waiting (1..%d; weights 2 and 1 get two slots and one)", tenant.MaxWeight)}
}

func credentialsText(creds []string) string {
	if creds == nil {
		return "all"
	}
	return strings.Join(creds, ",")
}

// deadLettersNote is what the report of a tenant's canceled jobs adds when dead of them were
// dead letters.
func deadLettersNote(dead int) string {
	if dead == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d of them dead letters, which no retry sends now)", dead)
}
