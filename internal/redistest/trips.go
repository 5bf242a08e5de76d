package redistest

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// ScriptTrips is a go-redis hook (client.AddHook) that counts the client's round trips running
// Lua scripts, EVALSHA or EVAL: a pipeline counts once, and a new connection's handshake not at
// all. It is safe for concurrent use.
type ScriptTrips struct{ n atomic.Int64 }

// Count is how many script round trips the client made since the hook was added.
func (h *ScriptTrips) Count() int { return int(h.n.Load()) }

func isScript(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }

// DialHook implements redis.Hook.
func (h *ScriptTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *ScriptTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (h *ScriptTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && isScript(cmds[0]) {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}
