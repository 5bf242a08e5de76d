package api

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/png"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tokens"
)

// TestSubmit_ImagesCountTowardTheTokenCheck: an image is input the provider bills by its size
// (1,600 tokens at most on Anthropic, 1,445 on OpenAI); a request whose images of known size
// exceed the credential's whole input-token limit can never be sent: it is request_too_large at
// submit (it was accepted, counted as the few bytes of its text). An image whose size the body
// does not tell (a URL) may be a small one: it is reserved at the most, never refused for it. A
// small base64 image counts its size, and fits.
func TestSubmit_ImagesCountTowardTheTokenCheck(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credentials: []string{"claude", "oai"},
		kinds:       map[string]string{"claude": tokens.ProviderAnthropic, "oai": tokens.ProviderOpenAI},
		tokenLimits: map[string]tokens.Limits{"claude": {InputPerMinute: 2000}, "oai": {CombinedPerMinute: 2000}}})
	pngOf := func(w, h int) string {
		var img bytes.Buffer
		require.NoError(t, png.Encode(&img, image.NewGray(image.Rect(0, 0, w, h))))
		return base64.StdEncoding.EncodeToString(img.Bytes())
	}
	anthropic := func(data string) string {
		return `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + data + `"}}`
	}
	openAI := func(url string) string { return `{"type":"image_url","image_url":{"url":"` + url + `"}}` }
	body := func(cred, a, b string) string {
		return `{"credential":"` + cred + `","request":{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[` +
			a + `,` + b + `,{"type":"text","text":"compare"}]}]}}`
	}

	// 1,600 tokens each on Anthropic (1568 × 1100 px), 1,445 on OpenAI (2048 × 768 px: 8 tiles).
	large, wide := pngOf(1568, 1100), "data:image/png;base64,"+pngOf(2048, 768)
	for _, tc := range []struct{ name, body string }{
		{"Anthropic", body("claude", anthropic(large), anthropic(large))},
		{"OpenAI", body("oai", openAI(wide), openAI(wide))},
	} {
		r := b.do(t, "POST", "/v1/jobs", tc.body, nil)
		require.Equal(t, 400, r.status, "%s: %v", tc.name, r.body)
		e := r.body["error"].(map[string]any)
		require.Equal(t, "request_too_large", e["type"], tc.name)
		require.Contains(t, e["message"], "can never be sent", tc.name)
	}

	url := `{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}`
	openAIURL := openAI("https://example.com/a.png")
	small := pngOf(200, 200) // 54 tokens on Anthropic
	for _, tc := range []struct{ name, body string }{
		{"AnthropicURLs", body("claude", url, url)},
		{"OpenAIURLs", body("oai", openAIURL, openAIURL)},
		{"AnthropicSmall", body("claude", anthropic(small), anthropic(small))},
	} {
		r := b.do(t, "POST", "/v1/jobs", tc.body, nil)
		require.Equal(t, 202, r.status, "%s: %v", tc.name, r.body)
	}
	require.Equal(t, 3, countJobs(t, b, "default"))
}
