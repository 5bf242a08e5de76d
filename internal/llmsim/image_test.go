package llmsim_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/tokens"
)

// pngBase64 is a w × h PNG, base64.
func pngBase64(t *testing.T, w, h int) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))))
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

// TestServer_ImagesAreInput: an image's input tokens are charged as its provider bills them, on
// top of the text's bytes / 4: Anthropic width × height / 750 after the 1568-px resize (at most
// 1,600), OpenAI 85 at low detail, else 85 + 170 per 512-px tile; a URL image, whose size the
// body does not tell, the provider's most for one image. The usage reports them, streamed and
// in a batch's results too, and the input-token buckets are charged them.
func TestServer_ImagesAreInput(t *testing.T) {
	t.Parallel()
	b := setup(t, llmsim.Config{InputTokensPerMinute: 1_000_000})
	charged := 0
	small, large := pngBase64(t, 300, 200), pngBase64(t, 3000, 2000)
	anthropic := func(source string) string {
		return `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[` +
			`{"type":"text","text":"12345678"},{"type":"image","source":` + source + `}]}]}`
	}
	for name, tc := range map[string]struct {
		source string
		want   int
	}{
		"Small": {`{"type":"base64","media_type":"image/png","data":"` + small + `"}`, 2 + 80},
		"Large": {`{"type":"base64","media_type":"image/png","data":"` + large + `"}`, 2 + 1600},
		"URL":   {`{"type":"url","url":"https://example.com/cat.png"}`, 2 + 1600},
	} {
		r := b.anthropic(t, "k", anthropic(tc.source))
		require.Equal(t, http.StatusOK, r.status, "%s: %s", name, r.body)
		require.EqualValues(t, tc.want, r.json(t)["usage"].(map[string]any)["input_tokens"], name)
		charged += tc.want
	}

	openai := func(part string) string {
		return `{"model":"m","messages":[{"role":"user","content":[` +
			`{"type":"text","text":"12345678"},{"type":"image_url","image_url":` + part + `}]}]}`
	}
	for name, tc := range map[string]struct {
		part string
		want int
	}{
		"Small": {`{"url":"data:image/png;base64,` + small + `"}`, 2 + 85 + 170},
		"Low":   {`{"url":"data:image/png;base64,` + large + `","detail":"low"}`, 2 + 85},
		"Large": {`{"url":"data:image/png;base64,` + large + `","detail":"high"}`, 2 + 85 + 6*170},
		"URL":   {`{"url":"https://example.com/cat.png"}`, 2 + 85 + 8*170},
	} {
		r := b.openai(t, "k", openai(tc.part))
		require.Equal(t, http.StatusOK, r.status, "%s: %s", name, r.body)
		require.EqualValues(t, tc.want, r.json(t)["usage"].(map[string]any)["prompt_tokens"], name)
		charged += tc.want
	}

	part := `{"type":"image","source":{"type":"base64","media_type":"image/png",` +
		`"data":"` + small + `"}}`
	r := b.anthropic(t, "k", `{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user",`+
		`"content":[{"type":"text","text":"12345678"},`+part+`]}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Contains(t, string(r.body), `"input_tokens":82`)
	r = b.openai(t, "k", `{"model":"m","stream":true,"stream_options":{"include_usage":true},`+
		`"messages":[{"role":"user","content":[{"type":"text","text":"12345678"},`+
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,`+small+`"}}]}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Contains(t, string(r.body), `"prompt_tokens":257`)
	require.Equal(t, charged+82+257, b.stats(t).InputTokens)

	headers := map[string]string{"x-api-key": "k", "anthropic-version": "2023-06-01"}
	r = b.mustDo(t, http.MethodPost, "/v1/messages/batches", headers, `{"requests":[{"custom_id":"a",`+
		`"params":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[`+
		`{"type":"text","text":"12345678"},`+part+`]}]}}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	results := "/v1/messages/batches/" + r.json(t)["id"].(string) + "/results"
	r = b.mustDo(t, http.MethodGet, results, headers, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Contains(t, string(r.body), `"input_tokens":82`, "the batch result's usage")
}

// pngHeader is a base64 PNG that says it is w × h: a 1 × 1 PNG whose IHDR chunk is rewritten
// (its CRC too), which is all a reader of its size decodes. No image of that size is encoded.
func pngHeader(t *testing.T, w, h int) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, image.NewGray(image.Rect(0, 0, 1, 1))))
	b := buf.Bytes()
	binary.BigEndian.PutUint32(b[16:20], uint32(w)) // after the signature, IHDR's length and type
	binary.BigEndian.PutUint32(b[20:24], uint32(h))
	binary.BigEndian.PutUint32(b[29:33], crc32.ChecksumIEEE(b[12:29]))
	return base64.StdEncoding.EncodeToString(b)
}

// webpHeader is a base64 WebP (VP8X) whose canvas is w × h: its first 30 bytes.
func webpHeader(w, h int) string {
	b := []byte("RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00" +
		"\x00\x00\x00\x00\x00\x00")
	b[24], b[25], b[26] = byte(w-1), byte((w-1)>>8), byte((w-1)>>16)
	b[27], b[28], b[29] = byte(h-1), byte((h-1)>>8), byte((h-1)>>16)
	return base64.StdEncoding.EncodeToString(b)
}

// encoded is img encoded by encode, base64.
func encoded(t *testing.T, encode func(io.Writer, image.Image) error, img image.Image) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, encode(&buf, img))
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

// TestServer_ImagesAsTheEstimateCountsThem: llmsim reports an image request's input tokens as
// internal/tokens counts them, whatever the image's size, format and detail, so that the ratio
// llmq learns on the simulator stays 1. llmsim keeps its own implementation of the providers'
// rule (it reads the whole image, internal/tokens its header alone): this test compares the two.
func TestServer_ImagesAsTheEstimateCountsThem(t *testing.T) {
	t.Parallel()
	b := setup(t, llmsim.Config{})
	gray := func(w, h int) image.Image { return image.NewGray(image.Rect(0, 0, w, h)) }
	jpegEncode := func(w io.Writer, img image.Image) error { return jpeg.Encode(w, img, nil) }
	gifEncode := func(w io.Writer, img image.Image) error { return gif.Encode(w, img, nil) }
	images := map[string]string{
		"JPEG 700x300":  encoded(t, jpegEncode, gray(700, 300)),
		"JPEG 1600x900": encoded(t, jpegEncode, gray(1600, 900)),
		"GIF 100x900":   encoded(t, gifEncode, gray(100, 900)),
		"WebP 5000x10":  webpHeader(5000, 10),
		"WebP 1024x768": webpHeader(1024, 768),
		"NotAnImage":    base64.StdEncoding.EncodeToString([]byte("not an image at all")),
	}
	for _, s := range [][2]int{{1, 1}, {300, 200}, {512, 512}, {513, 513}, {768, 1024}, {1092, 1092},
		{1568, 1568}, {1569, 700}, {2000, 1000}, {2048, 4096}, {4000, 3000}, {20000, 300},
		{7, 9000}, {1100, 820}} {
		images[fmt.Sprintf("PNG %dx%d", s[0], s[1])] = pngHeader(t, s[0], s[1])
	}
	for name, data := range images {
		bodies := map[string]string{
			"anthropic": `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[` +
				`{"type":"text","text":"look"},{"type":"image","source":{"type":"base64",` +
				`"media_type":"image/png","data":"` + data + `"}}]}]}`,
		}
		for _, detail := range []string{"", "low", "high", "auto"} {
			bodies["openai "+detail] = `{"model":"m","messages":[{"role":"user","content":[{"type":"text",` +
				`"text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + data +
				`","detail":"` + detail + `"}}]}]}`
		}
		for api, body := range bodies {
			provider, field, send := "anthropic", "input_tokens", b.anthropic
			if api != "anthropic" {
				provider, field, send = "openai", "prompt_tokens", b.openai
			}
			want, err := tokens.Count(provider, []byte(body))
			require.NoError(t, err)
			r := send(t, "k", body)
			require.Equal(t, http.StatusOK, r.status, "%s %s: %s", name, api, r.body)
			usage := r.json(t)["usage"].(map[string]any)
			require.EqualValues(t, want.Input, usage[field], "%s %s", name, api)
		}
	}
}
