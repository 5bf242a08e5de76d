package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/jobs"
)

func (a *app) deadCommand() *cli.Command {
	jsonFlag := &cli.BoolFlag{Name: "json", Usage: "print JSON"}
	return &cli.Command{
		Name:  "dead",
		Usage: "inspect, retry and purge dead-lettered jobs",
		Subcommands: []*cli.Command{{
			Name:  "list",
			Usage: "list dead jobs, most recently dead first",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "reason", Usage: "only this dead reason (" + strings.Join(jobs.DeadReasons(), ", ") + ")"},
				&cli.StringFlag{Name: "credential", Usage: "only jobs sent to this credential (their own, or a fallback they reached)"},
				tenantFlag(),
				&cli.StringFlag{Name: "since", Usage: "only jobs that died within this long (30m, 24h, 7d)"},
				&cli.IntFlag{Name: "limit", Value: 50, Usage: "at most this many"},
				&cli.StringFlag{Name: "after", Usage: "the next page: the jobs listed after the dead job of this ID (the last one shown)"},
				&cli.BoolFlag{Name: "json", Usage: "print JSON: an array of at most --limit jobs, without a next-page marker: " +
					"the next page is --after the last job's id; an empty array is the end"},
			},
			Action: a.deadList,
		}, {
			Name:      "show",
			Usage:     "show a dead job: its request size and model, and every attempt, with the usage its provider counted for it",
			ArgsUsage: "ID",
			Flags:     []cli.Flag{jsonFlag},
			Action:    a.deadShow,
		}, {
			Name:      "retry",
			Usage:     "put dead jobs back to queued with a fresh attempt budget (their history is kept); a revoked tenant's are left dead",
			ArgsUsage: "ID... | --all",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "all", Usage: "every dead job (narrowed by --reason, --credential and --tenant)"},
				&cli.StringFlag{Name: "reason", Usage: "with --all: only this dead reason"},
				&cli.StringFlag{Name: "credential", Usage: "with --all: only jobs sent to this credential (their own, or a fallback they reached)"},
				&cli.StringFlag{Name: "tenant", Usage: "with --all: only this tenant's jobs"},
			},
			Action: a.deadRetry,
		}, {
			Name:      "purge",
			Usage:     "delete dead jobs, with their attempts, events and idempotency keys (a resubmit of such a key makes a new job)",
			ArgsUsage: "ID... | --older-than D",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "older-than", Usage: "every job that died longer ago than this (24h, 30d)"},
			},
			Action: a.deadPurge,
		}},
	}
}

func (a *app) deadList(c *cli.Context) error {
	if c.NArg() != 0 {
		return cli.Exit("usage: ctl dead list [--reason R] [--credential C] [--tenant T] [--since D] [--limit N] [--after ID] [--json]", exitUsage)
	}
	if c.Int("limit") < 1 {
		return cli.Exit("--limit must be at least 1", exitUsage)
	}
	if err := checkDeadReason(c); err != nil {
		return err
	}
	tenant, err := tenantFilter(c)
	if err != nil {
		return err
	}
	f := jobs.DeadFilter{Reason: c.String("reason"), Credential: c.String("credential"), Tenant: tenant, Limit: c.Int("limit")}
	after := jobs.CanonicalID(c.String("after"))
	if c.IsSet("after") && !jobs.ValidID(after) {
		return cli.Exit(fmt.Sprintf("--after %q: want the ID of a dead job (the last one listed)", c.String("after")), exitUsage)
	}
	var since time.Duration
	if s := c.String("since"); s != "" {
		if since, err = parseAge("since", s); err != nil {
			return err
		}
	}
	p, err := a.pool(c)
	if err != nil {
		return err
	}
	defer p.Close()
	store := jobs.NewStore(p, nil)
	if since > 0 { // counted back on Postgres's clock, which wrote finished_at
		if f.Since, err = store.Ago(c.Context, since); err != nil {
			return err
		}
	}
	cursor := ""
	if after != "" {
		if cursor, err = deadCursor(c.Context, store, after); err != nil {
			return err
		}
	}
	page, err := store.PageDead(c.Context, f, cursor)
	if err != nil {
		return err
	}
	if err := printList(a.out, c.Bool("json"), listed(page.Jobs), "no dead jobs", "ID\tTENANT\tCREDENTIAL\tREASON\tATTEMPTS\tDIED\tLAST ERROR",
		func(j listedJob) []string {
			reason := "-"
			if j.DeadReason != nil {
				reason = *j.DeadReason
			}
			return []string{j.ID, j.Tenant, deadCredentialText(j.Job), reason, attemptsText(j.Job), ts(j.FinishedAt),
				lastErrorText(j.LastError)}
		}); err != nil {
		return err
	}
	if page.Next != "" && !c.Bool("json") { // JSON: the last job's id is the next --after
		_, err = fmt.Fprintf(a.out, "next page: %s\n", nextDeadPage(c, page.Jobs[len(page.Jobs)-1].ID))
	}
	return err
}

// deadCursor is the page cursor of `ctl dead list --after ID`: it goes on after dead job id.
func deadCursor(ctx context.Context, store *jobs.Store, id string) (string, error) {
	job, err := store.Get(ctx, id)
	if errors.Is(err, jobs.ErrNotFound) {
		return "", fmt.Errorf("--after %s: no such job (purged?); start again without --after", id)
	}
	if err != nil {
		return "", err
	}
	cursor, ok := jobs.DeadCursor(job)
	if !ok {
		return "", fmt.Errorf("--after %s: the job is %s, not dead (retried or canceled since?); start again without --after", id, job.Status)
	}
	return cursor, nil
}

// nextDeadPage is the command line that lists the page after last: this one's store flags (see
// storeArgs) and filters, with --after last.
func nextDeadPage(c *cli.Context, last string) string {
	args := append([]string{"ctl"}, storeArgs(c)...)
	args = append(args, "dead", "list")
	for _, name := range []string{"reason", "credential", "tenant", "since"} {
		if v := c.String(name); v != "" {
			args = append(args, "--"+name, shellQuote(v))
		}
	}
	if c.IsSet("limit") {
		args = append(args, "--limit", strconv.Itoa(c.Int("limit")))
	}
	return strings.Join(append(args, "--after", last), " ")
}

// checkDeadReason refuses a --reason that is no dead reason (jobs.DeadReasons, which the
// console's filter takes too) as a usage error: it would match no job, and a retry of none or an
// empty list would read as "there are none".
func checkDeadReason(c *cli.Context) error {
	if r := c.String("reason"); r != "" && !jobs.ValidDeadReason(r) {
		return cli.Exit(fmt.Sprintf("--reason %q: want %s", r, strings.Join(jobs.DeadReasons(), " or ")), exitUsage)
	}
	return nil
}

// deadCredentialText names, for tables, the credential a dead job died on, and its own when it
// had failed over to a fallback: "backup (from default)". The alert and the pause name the
// first, llmq_dead_letters_total the second; --credential selects by either.
func deadCredentialText(j *jobs.Job) string {
	if c := j.CurrentCredential(); c != j.Credential {
		return c + " (from " + j.Credential + ")"
	}
	return j.Credential
}

// attemptsText is a job's attempts made out of its most, as tables show it: "2/5".
func attemptsText(j *jobs.Job) string {
	return fmt.Sprintf("%d/%d", j.Attempts, j.MaxAttempts)
}

// lastErrorText is a one-line summary of a job's last error for tables.
func lastErrorText(le *jobs.LastError) string {
	if le == nil {
		return "-"
	}
	s := le.Class
	if le.Status != 0 {
		s += fmt.Sprintf(" %d", le.Status)
	}
	return printable(oneLineText(s+": "+le.Message, 60)) // the provider's text, quoting the tenant's
}

func (a *app) deadShow(c *cli.Context) error {
	if c.NArg() != 1 {
		return cli.Exit("usage: ctl dead show ID [--json]", exitUsage)
	}
	id := c.Args().First()
	p, err := a.pool(c)
	if err != nil {
		return err
	}
	defer p.Close()
	store := jobs.NewStore(p, nil)
	job, err := store.Get(c.Context, id)
	if errors.Is(err, jobs.ErrNotFound) {
		return fmt.Errorf("no job %q", id)
	}
	if err != nil {
		return err
	}
	if job.Status != jobs.StatusDead {
		return fmt.Errorf("job %s is %s, not dead; see 'ctl jobs show'", job.ID, job.Status)
	}
	attempts, err := store.Attempts(c.Context, job.ID)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		if attempts == nil {
			attempts = []jobs.AttemptRow{}
		}
		return writeJSON(a.out, map[string]any{
			"job":      job,
			"tenant":   job.Tenant,
			"request":  map[string]any{"bytes": len(job.Request), "model": requestModel(job.Request)},
			"attempts": attempts,
		})
	}
	return printJob(a, job, attempts)
}

// jobIDs are the job IDs of a command line as the store names them (jobs.CanonicalID), each
// once, in the order given: an ID in capitals names its job too, an ID given twice is one job (the
// audit entry names it as its target), and what was done is told ID by ID.
func jobIDs(c *cli.Context) []string {
	var ids []string
	for _, id := range c.Args().Slice() {
		if id = jobs.CanonicalID(id); !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

func (a *app) deadRetry(c *cli.Context) error {
	ids := jobIDs(c)
	all := c.Bool("all")
	switch {
	case all && len(ids) > 0:
		return cli.Exit("give job IDs or --all, not both", exitUsage)
	case !all && len(ids) == 0:
		return cli.Exit("usage: ctl dead retry ID... | --all [--reason R] [--credential C] [--tenant T]", exitUsage)
	case !all && (c.IsSet("reason") || c.IsSet("credential") || c.IsSet("tenant")):
		return cli.Exit("--reason, --credential and --tenant go with --all", exitUsage)
	}
	if err := checkDeadReason(c); err != nil {
		return err
	}
	tenant, err := tenantFilter(c)
	if err != nil {
		return err
	}
	// Redis first: a job set queued that no task carries would wait for the sweeper.
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
	store := jobs.NewStore(p, nil)
	f := jobs.DeadFilter{Reason: c.String("reason"), Credential: c.String("credential"), Tenant: tenant}
	if !all {
		f.IDs = ids
	}
	// RetryDead commits each batch before it is enqueued and told: a run stopped halfway (an
	// error, Ctrl-C) keeps the batches done, and the audit entry counts them.
	var problems, requeued []string
	var unqueued int // --all: jobs queued whose task was not enqueued
	_, retryErr := store.RetryDead(c.Context, f, &jobs.RetryDeadOpts{Batch: deadRetryBatch,
		BatchFunc: func(ctx context.Context, batch []jobs.Unfinished) error {
			for _, job := range batch {
				requeued = append(requeued, job.ID)
				if err := tasks.Requeue(ctx, job.ID, job.Priority); err != nil {
					if unqueued++; !all || unqueued == 1 {
						problems = append(problems, fmt.Sprintf("%s is queued but its task was not enqueued (the sweeper will): %v", job.ID, err))
					}
					continue
				}
				if !all {
					fmt.Fprintf(a.out, "requeued %s\n", job.ID)
				}
			}
			if all && len(batch) == deadRetryBatch { // more may follow: a long run tells its progress
				fmt.Fprintf(a.out, "requeued %d dead jobs so far\n", len(requeued))
			}
			return nil
		}})
	if retryErr != nil {
		problems = append([]string{fmt.Sprintf("retry stopped after %d jobs: %v", len(requeued), retryErr)}, problems...)
	}
	if all && unqueued > 1 {
		problems = append(problems, fmt.Sprintf("%d more jobs are queued without a task (the sweeper will enqueue them)", unqueued-1))
	}
	if all && retryErr == nil {
		if len(requeued) == 0 {
			fmt.Fprintln(a.out, "no dead jobs matched")
		} else {
			fmt.Fprintf(a.out, "requeued %d dead jobs\n", len(requeued))
		}
	}
	revoked := 0 // --all: the dead jobs of revoked tenants it left dead
	if all && retryErr == nil {
		var err error
		switch revoked, err = store.CountDeadOfRevoked(c.Context, f); {
		case err != nil:
			problems = append(problems, err.Error())
		case revoked > 0:
			fmt.Fprintf(a.out, "skipped %d dead jobs of revoked tenants (%s)\n", revoked, revokedDeadNote)
		}
	}
	detail := map[string]any{"requested": ids}
	if all {
		detail = map[string]any{"all": true, "reason": f.Reason, "credential": f.Credential}
		if f.Tenant != "" {
			detail["tenant"] = f.Tenant
		}
		if revoked > 0 {
			detail["skipped_revoked"] = revoked
		}
	}
	if err := logAction(context.WithoutCancel(c.Context), p, audit.Entry{Action: "dead.retry", Target: audit.TargetOf(ids),
		Count: len(requeued), Detail: detail}); err != nil {
		problems = append(problems, err.Error())
	}
	if retryErr == nil {
		problems = append(problems, whyNotDone(c.Context, store, ids, requeued, func(id string) string {
			// RetryDead leaves a revoked tenant's dead letters dead, and the jobs that died after
			// it began.
			switch n, err := store.CountDeadOfRevoked(c.Context, jobs.DeadFilter{IDs: []string{id}}); {
			case err != nil:
				return err.Error()
			case n == 1:
				return "its tenant is revoked: " + revokedDeadNote
			}
			return "it died after the retry began; run it again"
		})...)
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// revokedDeadNote tells why a retry left a revoked tenant's dead letters alone, and what to do.
const revokedDeadNote = "no retry sends a revoked tenant's dead letters; ctl tenants revoke NAME --cancel-jobs cancels them"

// deadRetryBatch is how many jobs one transaction of ctl dead retry puts back (see jobs.RetryDead);
// --all tells its progress after each.
const deadRetryBatch = 500

// whyNotDone says, for each of the ids an action on dead jobs asked for and did not do (not in
// done), why: not a job ID, no such job, a job that is not dead, or, for one still dead, deadWhy(id).
func whyNotDone(ctx context.Context, store *jobs.Store, ids, done []string, deadWhy func(id string) string) []string {
	var problems []string
	for _, id := range ids {
		if slices.Contains(done, id) {
			continue
		}
		if !jobs.ValidID(id) {
			problems = append(problems, fmt.Sprintf("%q is not a job ID", id))
			continue
		}
		job, err := store.Get(ctx, id)
		switch {
		case errors.Is(err, jobs.ErrNotFound):
			problems = append(problems, fmt.Sprintf("no job %q", id))
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s: %v", id, err))
		case job.Status == jobs.StatusDead:
			problems = append(problems, fmt.Sprintf("job %s was left dead: %s", id, deadWhy(id)))
		default:
			problems = append(problems, fmt.Sprintf("job %s is %s, not dead", id, job.Status))
		}
	}
	return problems
}

func (a *app) deadPurge(c *cli.Context) error {
	ids, age := jobIDs(c), c.String("older-than")
	if (len(ids) == 0) == (age == "") {
		return cli.Exit("usage: ctl dead purge ID... | --older-than D", exitUsage)
	}
	var d time.Duration
	if age != "" {
		var err error
		if d, err = parseAge("older-than", age); err != nil {
			return err
		}
	}
	p, err := a.pool(c)
	if err != nil {
		return err
	}
	defer p.Close()
	store := jobs.NewStore(p, nil)
	if age != "" {
		before, err := store.Ago(c.Context, d) // on Postgres's clock, which wrote finished_at
		if err != nil {
			return err
		}
		// Each batch commits on its own: a long purge tells its progress after each, as a retry
		// --all does, and one stopped halfway (an error, Ctrl-C) says how many it deleted.
		n, err := store.PurgeDead(c.Context, before, &jobs.PurgeDeadOpts{BatchFunc: func(_ context.Context, purged int64) {
			fmt.Fprintf(a.out, "purged %d dead jobs so far\n", purged)
		}})
		if err != nil {
			if n == 0 {
				return err
			}
			logErr := logAction(context.WithoutCancel(c.Context), p, audit.Entry{Action: "dead.purge", Count: int(n),
				Detail: map[string]any{"older_than": d.String()}})
			return errors.Join(fmt.Errorf("purge stopped after %d jobs: %w", n, err), logErr)
		}
		if _, err := fmt.Fprintf(a.out, "purged %d dead jobs\n", n); err != nil {
			return err
		}
		return logAction(c.Context, p, audit.Entry{Action: "dead.purge", Count: int(n),
			Detail: map[string]any{"older_than": d.String()}})
	}
	purged, err := store.PurgeDeadIDs(c.Context, ids)
	if err != nil {
		return err
	}
	for _, id := range purged {
		fmt.Fprintf(a.out, "purged %s\n", id)
	}
	problems := whyNotDone(c.Context, store, ids, purged, func(string) string { return "another change held it; try again" })
	if err := logAction(c.Context, p, audit.Entry{Action: "dead.purge", Target: audit.TargetOf(ids), Count: len(purged),
		Detail: map[string]any{"requested": ids}}); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}
