package redistest

import (
	"context"
	"slices"
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

// Trips is a go-redis hook (client.AddHook) that counts all of the client's round trips: a
// command, a pipeline or a transaction counts once (a script sent again as EVAL after NOSCRIPT
// counts twice), a new connection's handshake (HELLO, AUTH, SELECT, CLIENT SETINFO, which go
// through the hooks too) not at all. It is safe for concurrent use.
type Trips struct{ n atomic.Int64 }

// Count is how many round trips the client made since the hook was added.
func (h *Trips) Count() int { return int(h.n.Load()) }

// DialHook implements redis.Hook.
func (h *Trips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *Trips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isHandshake(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

// isHandshake reports whether cmd is one a new connection sends before it is used.
func isHandshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "auth", "select", "client":
		return true
	}
	return false
}

// ProcessPipelineHook implements redis.Hook.
func (h *Trips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !isHandshake(cmds[0]) {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// Commands is a go-redis hook (client.AddHook) that counts the client's commands of the names it
// was made with (NewCommands), sent alone or in a pipeline, each command once. It is safe for
// concurrent use.
type Commands struct {
	names []string
	n     atomic.Int64
}

// NewCommands returns a Commands counting the commands named names (lower case, as
// redis.Cmder.Name gives them: "xrange").
func NewCommands(names ...string) *Commands { return &Commands{names: names} }

// Count is how many of its commands the client sent since the hook was added.
func (h *Commands) Count() int { return int(h.n.Load()) }

func (h *Commands) note(cmd redis.Cmder) {
	if slices.Contains(h.names, cmd.Name()) {
		h.n.Add(1)
	}
}

// DialHook implements redis.Hook.
func (h *Commands) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *Commands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.note(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (h *Commands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.note(cmd)
		}
		return next(ctx, cmds)
	}
}
