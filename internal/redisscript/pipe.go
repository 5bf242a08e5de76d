package redisscript

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// Call is one script call: the script, its keys and arguments, and what to do with the reply.
type Call struct {
	Script *Script
	// Keys are the script's KEYS (see Script.Run), boxed once where the caller keeps them.
	Keys []any
	Args []any
	// Done receives the call's reply after the round trip (cmd.Err() holds a Redis error); its
	// error is the call's. Nil: the reply is only checked for an error.
	Done func(ctx context.Context, cmd *redis.Cmd) error
}

// Run sends calls to rdb in one round trip (one call goes alone, without a pipeline), in order,
// and then runs each call's Done with its reply. It returns the calls' errors joined: a Done's
// error, or the Redis error of a call without Done. Calls must be independent of each other's
// replies; each runs whatever the others' outcomes.
func Run(ctx context.Context, rdb redis.UniversalClient, calls ...Call) error {
	switch len(calls) {
	case 0:
		return nil
	case 1:
		c := calls[0]
		return c.finish(ctx, c.Script.Run(ctx, rdb, c.Keys, c.Args...))
	}
	pipe := rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = c.Script.evalSha(ctx, c.Keys, c.Args)
		_ = pipe.Process(ctx, cmds[i]) // queued: the error is the reply's, read below
	}
	// Exec's error is the first failed command's; each call's own reply is read below.
	_, _ = pipe.Exec(ctx)
	errs := make([]error, 0, len(calls))
	for i, c := range calls {
		cmd := cmds[i]
		if isNoScript(cmd.Err()) {
			cmd = c.Script.eval(ctx, c.Keys, c.Args) // EVAL caches the script for the next EVALSHA
			_ = rdb.Process(ctx, cmd)
		}
		errs = append(errs, c.finish(ctx, cmd))
	}
	return errors.Join(errs...)
}

func (c Call) finish(ctx context.Context, cmd *redis.Cmd) error {
	if c.Done == nil {
		return cmd.Err()
	}
	return c.Done(ctx, cmd)
}
