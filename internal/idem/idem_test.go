package idem_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/idem"
	"github.com/llmq/llmq/internal/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestCanonical(t *testing.T) {
	t.Parallel()

	cases := []struct{ name, in, want string }{
		{"SortsKeys", `{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{"SortsNestedKeys", `{"z":{"y":1,"x":[{"d":1,"c":2}]}}`, `{"z":{"x":[{"c":2,"d":1}],"y":1}}`},
		{"DropsWhiteSpace", " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\":null } \n", `{"a":[1,2],"b":null}`},
		{"KeepsNumberLiterals", `{"a":1.0,"b":1e3,"c":-0,"d":12345678901234567890123}`, `{"a":1.0,"b":1e3,"c":-0,"d":12345678901234567890123}`},
		{"KeepsArrayOrder", `[3,1,2]`, `[3,1,2]`},
		{"NoHTMLEscaping", `{"a":"<b>&amp;</b>"}`, `{"a":"<b>&amp;</b>"}`},
		{"NormalisesStringEscapes", `{"a":"\u0041\/\u00e9"}`, `{"a":"A/é"}`},
		{"Scalars", `"x"`, `"x"`},
		{"EmptyObject", `{ }`, `{}`},
		{"DuplicateKeyLastWins", `{"a":1,"a":2}`, `{"a":2}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := idem.Canonical([]byte(tc.in))
			require.NoError(t, err)
			require.Equal(t, tc.want, string(got))
		})
	}
}

func TestCanonical_Invalid(t *testing.T) {
	t.Parallel()

	for name, in := range map[string]string{
		"Empty":            ``,
		"WhiteSpaceOnly":   " \n ",
		"Truncated":        `{"a":`,
		"BareWord":         `hello`,
		"TrailingComma":    `{"a":1,}`,
		"TrailingDocument": `{"a":1} {"b":2}`,
		"TrailingGarbage":  `{"a":1}x`,
		"TrailingBracket":  `{"a":1}]`,
		"TwoScalars":       `1 2`,
		"SingleQuotes":     `{'a':1}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := idem.Canonical([]byte(in))
			require.Error(t, err)
			_, err = idem.Fingerprint([]byte(in))
			require.Error(t, err)
		})
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()

	fp := func(t *testing.T, doc string) string {
		t.Helper()
		s, err := idem.Fingerprint([]byte(doc))
		require.NoError(t, err)
		require.Len(t, s, 64, "hex SHA-256")
		return s
	}

	t.Run("KeyOrderAndWhiteSpaceIgnored", func(t *testing.T) {
		t.Parallel()
		a := fp(t, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`)
		b := fp(t, "{\n  \"max_tokens\": 10,\n  \"messages\": [ { \"content\": \"hi\", \"role\": \"user\" } ],\n  \"model\": \"m\"\n}\n")
		require.Equal(t, a, b)
	})

	t.Run("Deterministic", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, fp(t, `{"a":[1,{"b":2}]}`), fp(t, `{"a":[1,{"b":2}]}`))
	})

	t.Run("DifferentValuesDiffer", func(t *testing.T) {
		t.Parallel()
		docs := []string{
			`{"model":"m","max_tokens":10}`,
			`{"model":"m","max_tokens":11}`,
			`{"model":"n","max_tokens":10}`,
			`{"model":"m","max_tokens":"10"}`,
			`{"model":"m","max_tokens":10,"x":null}`,
			`{"model":"m"}`,
			`{"Model":"m","max_tokens":10}`,
		}
		seen := map[string]string{}
		for _, d := range docs {
			s := fp(t, d)
			prev, dup := seen[s]
			require.False(t, dup, "%s and %s share a fingerprint", prev, d)
			seen[s] = d
		}
	})

	t.Run("NestedArrayOrderMatters", func(t *testing.T) {
		t.Parallel()
		require.NotEqual(t,
			fp(t, `{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}`),
			fp(t, `{"messages":[{"role":"assistant","content":"b"},{"role":"user","content":"a"}]}`))
		require.NotEqual(t, fp(t, `{"a":[[1,2],[3]]}`), fp(t, `{"a":[[2,1],[3]]}`))
	})

	t.Run("NumbersAreLiteral", func(t *testing.T) {
		t.Parallel()
		// 1 and 1.0 are different bodies to a provider; they are not merged.
		require.NotEqual(t, fp(t, `{"t":1}`), fp(t, `{"t":1.0}`))
		require.NotEqual(t, fp(t, `{"t":100}`), fp(t, `{"t":1e2}`))
		// Integers beyond float64 precision are not rounded together.
		require.NotEqual(t, fp(t, `{"n":9007199254740993}`), fp(t, `{"n":9007199254740992}`))
	})
}

func TestValidateKey(t *testing.T) {
	t.Parallel()

	printable := func(n int) string {
		var b strings.Builder
		for i := range n {
			b.WriteByte(byte('!' + i%('~'-'!'+1)))
		}
		return b.String()
	}

	for name, key := range map[string]string{
		"One":         "k",
		"UUID":        "0190a5b2-7c1e-7d3f-9a8b-123456789abc",
		"Max":         printable(idem.MaxKeyLength),
		"Punctuation": `!"#$%&'()*+,-./:;<=>?@[\]^_{|}~` + "`",
	} {
		t.Run("Accepts"+name, func(t *testing.T) {
			t.Parallel()
			require.NoError(t, idem.ValidateKey(key))
		})
	}
	for name, key := range map[string]string{
		"Empty":       "",
		"TooLong":     printable(idem.MaxKeyLength + 1),
		"Space":       "a b",
		"LeadingTab":  "\tab",
		"Newline":     "ab\n",
		"NUL":         "a\x00b",
		"DEL":         "a\x7f",
		"NonASCII":    "clé",
		"InvalidUTF8": "a\xffb",
	} {
		t.Run("Rejects"+name, func(t *testing.T) {
			t.Parallel()
			err := idem.ValidateKey(key)
			require.ErrorIs(t, err, idem.ErrInvalidKey)
		})
	}
}

// claimBundle is a migrated database for ClaimKey tests.
type claimBundle struct {
	pool *pgxpool.Pool
}

func setupClaim(t *testing.T) *claimBundle {
	t.Helper()
	return &claimBundle{pool: pgtest.Pool(t)}
}

// insertJob inserts a minimal queued job row with that id, as jobs.Store.Create does after a
// successful claim (the key's foreign key to jobs is deferred to commit).
func insertJob(ctx context.Context, tx pgx.Tx, id, tenant, fingerprint string) error {
	_, err := tx.Exec(ctx, `
INSERT INTO jobs (id, tenant, credential, fingerprint, status, request, max_attempts, timeout_ms, deadline)
VALUES ($1, $2, 'default', $3, 'queued', '{"model":"m"}', 3, 60000, now() + interval '1 minute')`,
		id, tenant, fingerprint)
	return err
}

// create claims the key and, when claimed, inserts the job, in one transaction committed at the
// end: the same sequence as jobs.Store.Create.
func (b *claimBundle) create(ctx context.Context, tenant, key, fp string) (idem.Claim, string, error) {
	id := uuid.NewString()
	var c idem.Claim
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		c, err = idem.ClaimKey(ctx, tx, tenant, key, fp, id)
		if err != nil {
			return err
		}
		if c.Claimed {
			return insertJob(ctx, tx, id, tenant, fp)
		}
		return nil
	})
	return c, id, err
}

func (b *claimBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func TestClaimKey_FirstThenReplay(t *testing.T) {
	t.Parallel()
	b := setupClaim(t)
	ctx := context.Background()

	first, id1, err := b.create(ctx, "default", "key-1", "fp-1")
	require.NoError(t, err)
	require.Equal(t, idem.Claim{Claimed: true, JobID: id1, Fingerprint: "fp-1"}, first)

	second, id2, err := b.create(ctx, "default", "key-1", "fp-2")
	require.NoError(t, err)
	require.NotEqual(t, id1, id2)
	require.False(t, second.Claimed)
	require.Equal(t, id1, second.JobID, "the replay gets the first job")
	require.Equal(t, "fp-1", second.Fingerprint, "the stored fingerprint is the first one")
	require.True(t, second.Matches("fp-1"))
	require.False(t, second.Matches("fp-2"))

	third, _, err := b.create(ctx, "default", "key-1", "fp-1")
	require.NoError(t, err)
	require.False(t, third.Claimed)
	require.Equal(t, id1, third.JobID)

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM jobs`))
}

func TestClaimKey_TenantsAreSeparate(t *testing.T) {
	t.Parallel()
	b := setupClaim(t)
	ctx := context.Background()

	a, idA, err := b.create(ctx, "tenant-a", "same-key", "fp")
	require.NoError(t, err)
	require.True(t, a.Claimed)
	require.Equal(t, idA, a.JobID)

	bb, idB, err := b.create(ctx, "tenant-b", "same-key", "fp")
	require.NoError(t, err)
	require.True(t, bb.Claimed, "another tenant's key does not collide")
	require.Equal(t, idB, bb.JobID)

	again, _, err := b.create(ctx, "tenant-a", "same-key", "fp")
	require.NoError(t, err)
	require.False(t, again.Claimed)
	require.Equal(t, idA, again.JobID)
}

func TestClaimKey_RollbackFreesKey(t *testing.T) {
	t.Parallel()
	b := setupClaim(t)
	ctx := context.Background()

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	lost := uuid.NewString()
	c, err := idem.ClaimKey(ctx, tx, "default", "k", "fp", lost)
	require.NoError(t, err)
	require.True(t, c.Claimed)
	require.NoError(t, insertJob(ctx, tx, lost, "default", "fp"))
	require.NoError(t, tx.Rollback(ctx))

	next, id, err := b.create(ctx, "default", "k", "fp")
	require.NoError(t, err)
	require.True(t, next.Claimed, "a rolled-back claim leaves the key free")
	require.Equal(t, id, next.JobID)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM jobs WHERE id = $1`, lost))
}

func TestClaimKey_KeyWithoutJobDoesNotCommit(t *testing.T) {
	t.Parallel()
	b := setupClaim(t)
	ctx := context.Background()

	// The key's foreign key is checked at commit: a key whose job was never inserted vanishes.
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := idem.ClaimKey(ctx, tx, "default", "k", "fp", uuid.NewString())
		return err
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23503", pgErr.Code, "foreign_key_violation")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM idempotency_keys`))
}

func TestClaimKey_BadJobID(t *testing.T) {
	t.Parallel()
	b := setupClaim(t)

	_, err := idem.ClaimKey(context.Background(), b.pool, "default", "k", "fp", "not-a-uuid")
	require.ErrorContains(t, err, "claim idempotency key")
}

// TestClaimKey_WaitsForUncommittedClaim holds a claim open in one transaction while a second
// claimer of the same key is blocked on it, then ends the first transaction: a commit hands the
// second claimer the first job, a rollback lets it claim.
func TestClaimKey_WaitsForUncommittedClaim(t *testing.T) {
	t.Parallel()

	for _, commit := range []bool{true, false} {
		name := "Rollback"
		if commit {
			name = "Commit"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupClaim(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			first, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer first.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
			id1 := uuid.NewString()
			c, err := idem.ClaimKey(ctx, first, "default", "k", "fp", id1)
			require.NoError(t, err)
			require.True(t, c.Claimed)
			require.NoError(t, insertJob(ctx, first, id1, "default", "fp"))

			second, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer second.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
			pid := second.Conn().PgConn().PID()
			id2 := uuid.NewString()
			type result struct {
				c   idem.Claim
				err error
			}
			done := make(chan result, 1)
			go func() {
				c, err := idem.ClaimKey(ctx, second, "default", "k", "fp", id2)
				done <- result{c, err}
			}()

			// Wait (by polling Postgres, not sleeping) until the second claimer is blocked on
			// the first one's row lock.
			require.Eventually(t, func() bool {
				var blocked bool
				err := b.pool.QueryRow(ctx, `SELECT cardinality(pg_blocking_pids($1)) > 0`, pid).Scan(&blocked)
				return err == nil && blocked
			}, 20*time.Second, 5*time.Millisecond)
			select {
			case r := <-done:
				t.Fatalf("second claim returned while the first was uncommitted: %+v, %v", r.c, r.err)
			default:
			}

			if commit {
				require.NoError(t, first.Commit(ctx))
			} else {
				require.NoError(t, first.Rollback(ctx))
			}
			r := <-done
			require.NoError(t, r.err)
			if commit {
				require.Equal(t, idem.Claim{Claimed: false, JobID: id1, Fingerprint: "fp"}, r.c)
				require.NoError(t, second.Commit(ctx))
			} else {
				require.Equal(t, idem.Claim{Claimed: true, JobID: id2, Fingerprint: "fp"}, r.c)
				require.NoError(t, insertJob(ctx, second, id2, "default", "fp"))
				require.NoError(t, second.Commit(ctx))
			}
			var stored string
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT job_id::text FROM idempotency_keys WHERE key = 'k'`).Scan(&stored))
			require.Equal(t, r.c.JobID, stored)
		})
	}
}

// TestClaimKey_Concurrent races 24 transactions for one key: exactly one claims it and every
// one of them ends up with that job. (Not more: other packages' tests share the server's 100
// connections.)
func TestClaimKey_Concurrent(t *testing.T) {
	t.Parallel()
	const n = 24

	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = n // every claimer in its own transaction at once
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := &claimBundle{pool: pool}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	type result struct {
		c   idem.Claim
		id  string
		err error
	}
	results := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c, id, err := b.create(ctx, "default", "contended", "fp")
			results[i] = result{c, id, err}
		}()
	}
	close(start)
	wg.Wait()

	var winner string
	for _, r := range results {
		require.NoError(t, r.err)
		if r.c.Claimed {
			require.Empty(t, winner, "more than one claimer won")
			winner = r.id
		}
	}
	require.NotEmpty(t, winner, "nobody claimed the key")
	for _, r := range results {
		require.Equal(t, winner, r.c.JobID)
		require.Equal(t, "fp", r.c.Fingerprint)
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM jobs`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys`))
}

func TestClaimKey_ContextCanceled(t *testing.T) {
	t.Parallel()
	b := setupClaim(t)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := idem.ClaimKey(ctx, b.pool, "default", "k", "fp", uuid.NewString())
	require.Error(t, err)
	require.True(t, errors.Is(err, context.Canceled), "got %v", err)
}

// TestClaimKey_ReplayTakesNoLock: a key committed before the claim is answered from a plain read,
// without the row lock of the claim's upsert and without writing the row again. With the lock,
// concurrent replays of one key (a client retrying a lost answer from many goroutines, or
// across replicas) ran one after another, each waiting for the previous one's commit: 200 of
// them took over 20 s on a loaded machine. Here another transaction holds the key row locked;
// the replay must not wait for it.
func TestClaimKey_ReplayTakesNoLock(t *testing.T) {
	t.Parallel()
	b := setupClaim(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	first, id1, err := b.create(ctx, "default", "key-locked", "fp-1")
	require.NoError(t, err)
	require.True(t, first.Claimed)
	var xmin string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT xmin::text FROM idempotency_keys WHERE key = 'key-locked'`).Scan(&xmin))

	holder, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.WithoutCancel(ctx)) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE key = 'key-locked' FOR UPDATE`)
	require.NoError(t, err)

	// Past 30 s the replay is waiting for the holder's lock (it never lets go before the end).
	replayCtx, replayCancel := context.WithTimeout(ctx, 30*time.Second)
	defer replayCancel()
	for _, fp := range []string{"fp-1", "fp-2"} {
		c, _, err := b.create(replayCtx, "default", "key-locked", fp)
		require.NoError(t, err, "a replay waited for a lock on its key's row")
		require.Equal(t, idem.Claim{Claimed: false, JobID: id1, Fingerprint: "fp-1"}, c)
	}
	require.NoError(t, holder.Rollback(ctx))
	var after string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT xmin::text FROM idempotency_keys WHERE key = 'key-locked'`).Scan(&after))
	require.Equal(t, xmin, after, "a replay wrote the key's row again")
}
