package redisscript

import (
	"context"
	"crypto/sha1" //nolint:gosec // EVALSHA names a script by its SHA-1; no security rests on it
	"encoding/hex"
	"errors"

	"github.com/redis/go-redis/v9"
)

// Script is a Lua script for the calls llmq makes on every job. go-redis's Script.Run boxes the
// script's SHA and each key into an interface at every call (cmdable.eval); a Script holds its
// SHA and source boxed once, and takes its keys boxed ([]any of strings), so that a caller that
// builds its keys once (a limiter gate, a breaker circuit) boxes them once too. It is safe for
// concurrent use.
type Script struct {
	src  string
	hash string
	// srcArg and hashArg are src and hash boxed, the second argument of EVAL and of EVALSHA.
	srcArg, hashArg any
}

// NewScript returns the script of Lua source src.
func NewScript(src string) *Script {
	sum := sha1.Sum([]byte(src)) //nolint:gosec // see the import
	hash := hex.EncodeToString(sum[:])
	return &Script{src: src, hash: hash, srcArg: src, hashArg: hash}
}

// Hash is the script's SHA-1, as EVALSHA and SCRIPT EXISTS name it.
func (s *Script) Hash() string { return s.hash }

// Run runs the script on rdb with EVALSHA and, when Redis has not cached it (NOSCRIPT: after a
// restart, a failover or SCRIPT FLUSH), again with EVAL, which caches it. keys are the script's
// KEYS, the first a string: on a Redis Cluster the call goes to its slot, as go-redis's
// Script.Run sends it; the others strings or Args arguments. args are sent as they are (go-redis flattens a lone slice or map argument;
// Run does not). It returns the command, holding the reply or the Redis error.
func (s *Script) Run(
	ctx context.Context, rdb redis.UniversalClient, keys []any, args ...any,
) *redis.Cmd {
	cmd := s.evalSha(ctx, keys, args)
	_ = rdb.Process(ctx, cmd)
	if isNoScript(cmd.Err()) {
		cmd = s.eval(ctx, keys, args)
		_ = rdb.Process(ctx, cmd)
	}
	return cmd
}

// evalSha is the EVALSHA command of a call; eval its EVAL.
func (s *Script) evalSha(ctx context.Context, keys, args []any) *redis.Cmd {
	return command(ctx, "evalsha", s.hashArg, keys, args)
}

func (s *Script) eval(ctx context.Context, keys, args []any) *redis.Cmd {
	return command(ctx, "eval", s.srcArg, keys, args)
}

// command builds name ("eval" or "evalsha", a constant: boxing it allocates nothing) with
// payload, keys and args in one slice, as go-redis's cmdable.eval does but without boxing payload
// and keys again. It says that its first key is at position 3: a ClusterClient routes a command
// by it, and for a command that does not say, it would format the key count back to a string
// (fmt.Sprint) to find the first key (cmdFirstKeyPosWithInfo).
func command(ctx context.Context, name, payload any, keys, args []any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, name, payload, len(keys))
	cmdArgs = append(cmdArgs, keys...)
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// isNoScript reports a reply of NOSCRIPT: Redis has not cached the script.
func isNoScript(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || errors.Is(err, redis.ErrNoScript))
}
