package redisscript_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// incrSrc counts a call: INCR KEYS[1], and returns the new count.
const incrSrc = `return redis.call('INCR', KEYS[1])`

var incrScript = redisscript.NewScript(incrSrc)

// uncached returns a script of the same effect as incrScript that Redis has never seen: its
// EVALSHA answers NOSCRIPT until something loads it.
func uncached() *redisscript.Script {
	return redisscript.NewScript("-- " + redistest.Rand() + "\nreturn redis.call('INCR', KEYS[1])")
}

func setup(t *testing.T) (*redis.Client, *redistest.ScriptTrips, string) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	require.NoError(t, rdb.ScriptLoad(ctx, incrSrc).Err())
	hook := &redistest.ScriptTrips{}
	rdb.AddHook(hook)
	return rdb, hook, redistest.Prefix(t)
}

// record returns a Done that appends the call's reply to got.
func record(got *[]int64) func(context.Context, *redis.Cmd) error {
	return func(_ context.Context, cmd *redis.Cmd) error {
		v, err := cmd.Int64()
		*got = append(*got, v)
		return err
	}
}

func TestRun_OneRoundTripInOrder(t *testing.T) {
	t.Parallel()
	rdb, hook, p := setup(t)
	var got []int64
	err := redisscript.Run(context.Background(), rdb,
		redisscript.Call{Script: incrScript, Keys: []any{p + "a"}, Done: record(&got)},
		redisscript.Call{Script: incrScript, Keys: []any{p + "a"}, Done: record(&got)},
		redisscript.Call{Script: incrScript, Keys: []any{p + "b"}, Done: record(&got)},
	)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 1}, got, "each Done gets its own reply, the calls ran in order")
	require.Equal(t, 1, hook.Count())
}

func TestRun_OneCallGoesAlone(t *testing.T) {
	t.Parallel()
	rdb, hook, p := setup(t)
	var got []int64
	require.NoError(t, redisscript.Run(context.Background(), rdb, redisscript.Call{Script: incrScript, Keys: []any{p + "a"}, Done: record(&got)}))
	require.Equal(t, []int64{1}, got)
	require.Equal(t, 1, hook.Count())
	require.NoError(t, redisscript.Run(context.Background(), rdb))
	require.Equal(t, 1, hook.Count(), "no calls, no round trip")
}

// A script Redis has not cached runs once, after the round trip; the calls around it run once.
func TestRun_UncachedScriptRunsOnce(t *testing.T) {
	t.Parallel()
	rdb, hook, p := setup(t)
	ctx := context.Background()
	fresh := uncached()
	var got []int64
	err := redisscript.Run(ctx, rdb,
		redisscript.Call{Script: incrScript, Keys: []any{p + "a"}, Done: record(&got)},
		redisscript.Call{Script: fresh, Keys: []any{p + "b"}, Done: record(&got)},
		redisscript.Call{Script: incrScript, Keys: []any{p + "c"}, Done: record(&got)},
	)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 1, 1}, got)
	for _, k := range []string{"a", "b", "c"} {
		n, err := rdb.Get(ctx, p+k).Int64()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "key %s counted once", k)
	}
	require.Equal(t, 2, hook.Count(), "the pipeline, then the uncached call alone")

	// EVAL cached it: the next round trip needs no second one.
	require.NoError(t, redisscript.Run(ctx, rdb,
		redisscript.Call{Script: fresh, Keys: []any{p + "b"}},
		redisscript.Call{Script: incrScript, Keys: []any{p + "c"}},
	))
	require.Equal(t, 3, hook.Count())
}

func TestRun_ErrorsAreEachCalls(t *testing.T) {
	t.Parallel()
	rdb, _, p := setup(t)
	ctx := context.Background()
	require.NoError(t, rdb.Set(ctx, p+"text", "not a number", 0).Err())
	errDone := errors.New("done failed")
	var ran int
	err := redisscript.Run(ctx, rdb,
		redisscript.Call{Script: incrScript, Keys: []any{p + "text"}}, // Redis refuses: not an integer
		redisscript.Call{Script: incrScript, Keys: []any{p + "a"}, Done: func(context.Context, *redis.Cmd) error { ran++; return errDone }},
		redisscript.Call{Script: incrScript, Keys: []any{p + "b"}, Done: func(_ context.Context, cmd *redis.Cmd) error { ran++; return cmd.Err() }},
	)
	require.ErrorIs(t, err, errDone)
	require.ErrorContains(t, err, "not an integer")
	require.Equal(t, 2, ran, "every Done runs, whatever the others' outcomes")
	n, err := rdb.Get(ctx, p+"b").Int64()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}
