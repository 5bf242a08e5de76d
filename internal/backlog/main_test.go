package backlog_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's background health check ends after the test's pool.Close.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}
