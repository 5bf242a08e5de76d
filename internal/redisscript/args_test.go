package redisscript_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

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
