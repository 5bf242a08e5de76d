package executor_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/png"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/tokens"
)

// A job whose prompt carries a base64 image, run against llmsim: the input tokens reserved (the
// fixed rule's, internal/tokens) are those llmsim reports, the image's included, so the ratio the
// estimator learns stays 1 on the simulator. Charged for its text alone, the job was reported
// 100 input tokens for the 180 reserved, and the ratio learned fell to ~0.56.
func TestExecutor_ImageReservedAsLLMSimReportsIt(t *testing.T) {
	t.Parallel()
	var png300x200 bytes.Buffer
	require.NoError(t, png.Encode(&png300x200, image.NewGray(image.Rect(0, 0, 300, 200))))
	body, err := json.Marshal(map[string]any{"model": "claude-test", "max_tokens": 16,
		"messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": strings.Repeat("a", 400)}, // 100 tokens
			map[string]any{"type": "image", "source": map[string]any{"type": "base64", // 80 tokens
				"media_type": "image/png", "data": base64.StdEncoding.EncodeToString(png300x200.Bytes())}},
		}}}})
	require.NoError(t, err)
	rule, err := tokens.Count("anthropic", body)
	require.NoError(t, err)
	require.Equal(t, 180, rule.Input)

	r := runJob(t, llmsim.New(llmsim.Config{}), body, &estimator.Config{PriorWeight: 1})
	var usage struct {
		InputTokens int `json:"input_tokens"`
	}
	require.NoError(t, json.Unmarshal(r.job.Usage, &usage), "usage: %s", r.job.Usage)
	require.Equal(t, rule.Input, usage.InputTokens, "llmsim reported other input tokens than reserved")
	require.InDelta(t, 1, r.est.Ratio("cache", "default", "claude-test"), 0.01)
}
