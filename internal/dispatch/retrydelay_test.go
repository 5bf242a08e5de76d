package dispatch_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/retrypolicy"
)

func TestRetryDelayFunc(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	policy := retrypolicy.New(&retrypolicy.Config{Float64: func() float64 { return 0.999999 }})
	delay := dispatch.RetryDelayFunc(policy, func() time.Time { return now })

	// A deferral comes back at its time, however often the task was deferred before.
	require.Equal(t, 7*time.Second, delay(500, &dispatch.DeferError{Until: now.Add(7 * time.Second)}, nil))
	require.Zero(t, delay(3, &dispatch.DeferError{Until: now.Add(-time.Second)}, nil))
	// A dead worker's task goes again at once.
	require.Zero(t, delay(500, asynq.ErrLeaseExpired, nil))
	// A store failure backs off, but never by more than 4 × the base delay: asynq's count
	// includes the deferrals, so it must not grow the wait to the policy's 60 s ceiling.
	storeErr := errors.New("begin attempt: conn closed")
	require.InDelta(t, float64(500*time.Millisecond), float64(delay(0, storeErr, nil)), float64(time.Millisecond))
	require.InDelta(t, float64(2*time.Second), float64(delay(500, storeErr, nil)), float64(time.Millisecond))
}
