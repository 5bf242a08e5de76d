package batchlane_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// TestDefaultMaxBytes_UnderOpenAIsCapInDecimalMegabytes: OpenAI caps a batch's input file at
// "200 MB". The default was 200 << 20 (209,715,200 bytes): if the cap is decimal, a full batch
// passed it by 9.7 MB and was refused as a whole, its jobs sent online at the full price.
// 200,000,000 is within the cap under either reading.
func TestDefaultMaxBytes_UnderOpenAIsCapInDecimalMegabytes(t *testing.T) {
	t.Parallel()
	require.LessOrEqual(t, int64(batchlane.DefaultMaxBytes), int64(200_000_000))
	require.EqualValues(t, 200_000_000, batchlane.DefaultMaxBytes, "as large as it may be: fewer, fuller batches")
}

// TestBatcher_BatchesStayWithinTheProvidersSizeCap: the providers cap a batch's bytes
// (Anthropic's create body, OpenAI's input file), and refuse a larger one as a whole, so that
// all its jobs would go online at the full price. Waiting jobs whose requests together pass the
// cap are split into batches that fit it, each sent at once, and answered at the batch price. A
// request is sent as stored: its <, > and & are not escaped (six bytes each) on the way.
func TestBatcher_BatchesStayWithinTheProvidersSizeCap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ provider, pad string }{
		{"anthropic", "x"}, {"openai", "x"}, {"anthropic", "<"}, {"openai", "&"},
	} {
		provider := c.provider
		t.Run(provider+"/"+c.pad, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider, maxBytes: 3000})
			bt := b.batcher(nil)
			var ids []string
			for i := range 3 {
				// About 1,100 bytes each: two fit in a batch, three do not.
				ids = append(ids, b.submit(t, string(rune('a'+i))+strings.Repeat(c.pad, 1000), 0, 0).ID)
			}
			b.clock.Advance(fill)
			once(t, bt)
			require.Empty(t, b.online(), "the batch was refused: its jobs went online")
			require.Equal(t, 2, b.sim.BatchStats().Created)
			require.Equal(t, 3, b.sim.BatchStats().Requests)
			b.clock.Advance(2 * time.Hour)
			once(t, bt)
			for _, id := range ids {
				got := b.get(t, id)
				require.Equal(t, jobs.StatusSucceeded, got.Status, "%s: %+v", id, got.LastError)
				require.Equal(t, "batch", *got.CostClass)
			}
		})
	}
}
