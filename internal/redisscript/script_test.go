package redisscript_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
)

// scriptFlush empties the script cache of every master of c (a private deployment's: SCRIPT FLUSH
// on a shared one would send the other tests' scripts to EVAL and change their round trips).
func scriptFlush(ctx context.Context, t *testing.T, c redis.UniversalClient) {
	t.Helper()
	if cc, ok := c.(*redis.ClusterClient); ok {
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return n.ScriptFlush(ctx).Err()
		}))
		return
	}
	require.NoError(t, c.ScriptFlush(ctx).Err())
}

// After SCRIPT FLUSH (a restart or a failover to a replica that never saw the script), a call
// still runs, once: alone, EVALSHA answers NOSCRIPT and EVAL runs it; in a pipeline, the calls
// that met NOSCRIPT are sent again with EVAL. On a Redis Cluster each master has its own cache.
func TestScript_RunAfterScriptFlush(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, target redistest.Target) {
		rdb := redistest.ClientOf(t, target.Private(t))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a, b := []any{"{a}:n"}, []any{"{b}:n"}
		count := func(keys []any) int64 {
			n, err := rdb.Get(ctx, keys[0].(string)).Int64()
			require.NoError(t, err)
			return n
		}

		require.NoError(t, incrScript.Run(ctx, rdb, a).Err(), "first call, never cached")
		scriptFlush(ctx, t, rdb)
		n, err := incrScript.Run(ctx, rdb, a).Int64()
		require.NoError(t, err, "direct call after SCRIPT FLUSH")
		require.EqualValues(t, 2, n)

		scriptFlush(ctx, t, rdb)
		var got []int64
		require.NoError(t, redisscript.Run(ctx, rdb,
			redisscript.Call{Script: incrScript, Keys: a, Done: record(&got)},
			redisscript.Call{Script: incrScript, Keys: b, Done: record(&got)},
		), "pipelined calls after SCRIPT FLUSH")
		require.Equal(t, []int64{3, 1}, got)
		require.EqualValues(t, 3, count(a), "each call ran once")
		require.EqualValues(t, 1, count(b))
	})
}

// movedHook counts the replies a Cluster node answered MOVED or ASK: a command sent to a node
// that does not hold its key's slot.
type movedHook struct{ n atomic.Int64 }

func (h *movedHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *movedHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(err)
		return err
	}
}

func (h *movedHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.count(c.Err())
		}
		return err
	}
}

func (h *movedHook) count(err error) {
	if redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") {
		h.n.Add(1)
	}
}

// On a Redis Cluster a call goes straight to the node of its first key's slot: the client finds
// the slot from the command Script.Run builds, and no node answers MOVED, alone or pipelined.
func TestScript_RunRoutesToTheKeysSlot(t *testing.T) {
	t.Parallel()
	hook := &movedHook{}
	addrs := strings.Split(strings.TrimPrefix(redistest.ClusterURL(), "redis-cluster://"), ",")
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs,
		NewClient: func(opt *redis.Options) *redis.Client {
			c := redis.NewClient(opt)
			c.AddHook(hook)
			return c
		}})
	t.Cleanup(func() { _ = rdb.Close() })
	p := redistest.PrefixOn(t, redistest.ClusterURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, rdb.ScriptLoad(ctx, incrSrc).Err()) // loads it on every master

	var calls []redisscript.Call
	for i := range 32 {
		key := []any{p + "{" + redistest.Rand() + "}"}
		n, err := incrScript.Run(ctx, rdb, key).Int64()
		require.NoError(t, err, "call %d", i)
		require.EqualValues(t, 1, n)
		calls = append(calls, redisscript.Call{Script: incrScript, Keys: key})
	}
	require.NoError(t, redisscript.Run(ctx, rdb, calls...))
	require.Zero(t, hook.n.Load(), "calls sent to a node that does not hold their slot")
}

// A Script's call answers as go-redis's Script.Run does, reply and error alike (it builds the
// command itself): redis.Nil for a nil reply, Lua's false and tables, a script's error reply, a
// command's error inside the script, and the context's error when the call never went out. A
// call that failed is not sent again (only NOSCRIPT is).
func TestScript_RunRepliesAsGoRedis(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, target redistest.Target) {
		rdb := redistest.ClientOf(t, target.URL)
		key := redistest.PrefixOn(t, target.URL) + "{k}"
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		canceled, cancelNow := context.WithCancel(ctx)
		cancelNow()
		for _, tc := range []struct {
			name, src string
			ctx       context.Context
		}{
			{name: "nil", src: `return nil`},
			{name: "false", src: `return false`},
			{name: "integer", src: `return 7`},
			{name: "table", src: `return {1, 'a', false, {2}}`},
			{name: "args", src: `return {KEYS[1], ARGV[1], ARGV[2], ARGV[3], #ARGV}`},
			{name: "error reply", src: `redis.call('INCR', KEYS[1] .. ':runs'); ` +
				`return redis.error_reply('ERR refused')`},
			{name: "command error", src: `redis.call('SET', KEYS[1], 'x'); ` +
				`return redis.call('INCR', KEYS[1])`},
			{name: "canceled", src: `return 1`, ctx: canceled},
		} {
			callCtx := ctx
			if tc.ctx != nil {
				callCtx = tc.ctx
			}
			// Each uncached (EVALSHA, then EVAL), then cached (EVALSHA alone).
			uncached := func() string { return "-- " + redistest.Rand() + "\n" + tc.src }
			theirs, ours := redis.NewScript(uncached()), redisscript.NewScript(uncached())
			args := []any{int64(5), "s", 1.5}
			for range 2 {
				want := theirs.Run(callCtx, rdb, []string{key}, args...)
				got := ours.Run(callCtx, rdb, []any{key}, args...)
				require.Equal(t, want.Val(), got.Val(), tc.name)
				if want.Err() == nil {
					require.NoError(t, got.Err(), tc.name)
					continue
				}
				require.Error(t, got.Err(), tc.name)
				require.Equal(t, strings.ReplaceAll(want.Err().Error(), theirs.Hash(), "<sha>"),
					strings.ReplaceAll(got.Err().Error(), ours.Hash(), "<sha>"), tc.name)
				require.Equal(t, errors.Is(want.Err(), redis.Nil), errors.Is(got.Err(), redis.Nil),
					tc.name)
				require.Equal(t, errors.Is(want.Err(), context.Canceled),
					errors.Is(got.Err(), context.Canceled), tc.name)
			}
		}
		runs, err := rdb.Get(ctx, key+":runs").Int64()
		require.NoError(t, err)
		require.EqualValues(t, 4, runs, "the failed script ran once a call")
	})
}
