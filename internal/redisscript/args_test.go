package redisscript_test

import (
	"context"
	"encoding"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
)

// echoScript returns its arguments as it received them.
var echoScript = redisscript.NewScript("return ARGV")

// An Args argument reaches the script as the string the value boxed alone sent: FormatInt's,
// FormatFloat's 'g', NowArg's, a call id; past the room an Args makes (more arguments, longer
// bytes) as well; a small integer and an empty string as they are.
func TestArgs_SentAsFormatted(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	ctx := context.Background()
	now := func() time.Time { return time.UnixMicro(1893499200000123) }
	ids := redisscript.NewCallIDs()
	first := ids.Next()
	var a redisscript.Args
	args := []any{a.Now(now), a.Now(nil), a.NowCall(now, ids), a.NowCall(nil, ids), a.Call(ids),
		a.Int(-42), a.Int(0), a.Int(255), a.Int(256), a.Text(""), a.Text("x y"), a.Float(2.5), a.Float(1e6),
		a.Float(0.1)}
	long := strings.Repeat("x", 300)
	want := []any{"1893499200000123", "", "1893499200000123 " + strings.TrimSuffix(first, "1") + "2",
		" " + strings.TrimSuffix(first, "1") + "3", strings.TrimSuffix(first, "1") + "4",
		"-42", "0", "255", "256", "", "x y", "2.5", "1e+06", "0.1"}
	for i := range 20 {
		args = append(args, a.End(append(append(a.Buf(), long...), strconv.Itoa(i)...)), a.Int(int64(i)*1e12))
		want = append(want, long+strconv.Itoa(i), strconv.FormatInt(int64(i)*1e12, 10))
	}
	got, err := echoScript.Run(ctx, rdb, []any{redistest.Prefix(t) + "k"}, args...).Slice()
	require.NoError(t, err)
	require.Equal(t, want, got)
}

// A Bytes argument reaches the script as the []byte boxed alone did: its bytes, empty or not,
// read when the call is written.
func TestBytes_SentAsTheBytes(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	data, empty, later := []byte(`{"d":"é"}`), []byte(nil), []byte("before")
	args := []any{redisscript.Bytes(&data), redisscript.Bytes(&empty), redisscript.Bytes(&later)}
	later = []byte("after") // read at the write, not at the call's making
	got, err := echoScript.Run(context.Background(), rdb, []any{redistest.Prefix(t) + "k"}, args...).Slice()
	require.NoError(t, err)
	require.Equal(t, []any{`{"d":"é"}`, "", "after"}, got)
}

// An argument's bytes end where the argument does: a reader that appends to them (a hook
// building a log line, say) writes into memory of its own, not into the next argument's.
func TestArgs_BytesEndAtTheArgument(t *testing.T) {
	t.Parallel()
	var a redisscript.Args
	first, second := a.Text("ab"), a.Int(1234)
	b, err := first.(encoding.BinaryMarshaler).MarshalBinary()
	require.NoError(t, err)
	_ = append(b, "XY"...)
	got, err := second.(encoding.BinaryMarshaler).MarshalBinary()
	require.NoError(t, err)
	require.Equal(t, "1234", string(got))
}

// An argument prints as what it sends (fmt, and go-redis's cmd.String(), which a log or an error
// shows), not as a pointer; Bytes' as its bytes.
func TestArgs_PrintAsSent(t *testing.T) {
	t.Parallel()
	var a redisscript.Args
	data := []byte(`{"d":1}`)
	args := []any{"evalsha", "sha", 1, a.Text("k"), a.Int(1234), a.Float(2.5), redisscript.Bytes(&data)}
	require.Equal(t, "k 1234 2.5 "+`{"d":1}`, fmt.Sprint(args[3:]...))
	require.Equal(t, `evalsha sha 1 k 1234 2.5 {"d":1}`, redis.NewCmd(context.Background(), args...).String())
}

// A Redis Cluster client routes a script call by its first key as go-redis reads it (fmt's
// form of an argument that is neither a string nor bytes): a first key formatted into an Args
// reaches the node of its slot, with no redirection (none is allowed here).
func TestArgs_FirstKeyRoutesOnCluster(t *testing.T) {
	t.Parallel()
	cc, ok := redistest.ClientOf(t, redistest.ClusterURL()).(*redis.ClusterClient)
	require.True(t, ok, "a cluster client")
	opt := *cc.Options()
	opt.MaxRedirects = -1 // a MOVED reply is the call's error
	rdb := redis.NewClusterClient(&opt)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := redistest.Prefix(t)
	// Keys of slots spread over the masters: a key misrouted to a random node fails with MOVED
	// on two of three of them.
	for i := range 12 {
		var a redisscript.Args
		key := prefix + "{" + strconv.Itoa(i) + "}:k"
		got, err := keyScript.Run(ctx, rdb, []any{a.Text(key)}).Text()
		require.NoError(t, err, "key %s", key)
		require.Equal(t, key, got)
	}
}

// keyScript returns its first key, writing nothing.
var keyScript = redisscript.NewScript("return KEYS[1]")

// A call sent again (EVAL after its pipelined EVALSHA's NOSCRIPT) sends its Args and Bytes
// arguments as the first time, byte for byte: they are read again, from bytes that did not
// change.
func TestArgs_SentAgainOnNoScript(t *testing.T) {
	t.Parallel()
	w := redistest.NewWire(t)
	prefix := redistest.Prefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A script of this test alone: Redis has not cached it, so its first EVALSHA is refused.
	script := redisscript.NewScript("return ARGV -- " + redistest.Rand())
	now := func() time.Time { return time.UnixMicro(1893499200000123) }
	ids := redisscript.NewCallIDs()
	data := []byte(`{"d":"é"}`)
	var replies [][]any
	call := func(key string) redisscript.Call {
		var a redisscript.Args
		return redisscript.Call{Script: script, Keys: []any{a.Text(prefix + key)},
			Args: []any{a.NowCall(now, ids), a.Int(1234), a.Float(0.1), a.Text(strings.Repeat("x", 200)),
				redisscript.Bytes(&data)},
			Done: func(_ context.Context, cmd *redis.Cmd) error {
				v, err := cmd.Slice()
				replies = append(replies, v)
				return err
			}}
	}
	require.NoError(t, redisscript.Run(ctx, w.Client, call("a"), call("b"))) // a pipeline
	// The scripts' commands, not the connections' handshakes.
	var cmds [][]string
	for _, c := range w.Commands(t) {
		if strings.HasPrefix(c[0], "eval") {
			cmds = append(cmds, c)
		}
	}
	require.Len(t, cmds, 4, "EVALSHA twice, then EVAL for each")
	for i, sha := range cmds[:2] {
		eval := cmds[2+i]
		require.Equal(t, []string{"evalsha", script.Hash()}, sha[:2])
		require.Equal(t, []string{"eval"}, eval[:1])
		require.Equal(t, sha[2:], eval[2:], "call %d sent again", i)
		require.Len(t, replies[i], 5)
		for j, v := range replies[i] {
			require.Equal(t, sha[4+j], v, "call %d argument %d", i, j)
		}
	}
	require.Equal(t, []string{"1234", "0.1", strings.Repeat("x", 200), `{"d":"é"}`}, cmds[3][5:])
}
