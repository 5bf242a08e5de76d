package tokens_test

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
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tokens"
)

// pngBase64 is a w×h PNG, base64 (a blank image: its header is what counts).
func pngBase64(t testing.TB, w, h int) string {
	t.Helper()
	return base64.StdEncoding.EncodeToString(pngBytes(t, w, h))
}

// pngBytes is a w×h PNG. Above a megapixel, it is a 1×1 PNG whose header says w×h (its CRC
// made right): the header is all the count reads, and encoding millions of pixels is most of a
// test's time under the race detector.
func pngBytes(t testing.TB, w, h int) []byte {
	t.Helper()
	var buf bytes.Buffer
	if w*h <= 1<<20 {
		require.NoError(t, png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))))
		return buf.Bytes()
	}
	require.NoError(t, png.Encode(&buf, image.NewGray(image.Rect(0, 0, 1, 1))))
	b := buf.Bytes()
	// The signature (8 bytes), then IHDR: length (4), type (4), width (4), height (4) ... CRC.
	binary.BigEndian.PutUint32(b[16:], uint32(w))
	binary.BigEndian.PutUint32(b[20:], uint32(h))
	binary.BigEndian.PutUint32(b[29:], crc32.ChecksumIEEE(b[12:29]))
	return b
}

// anthropicImage is an Anthropic request of 4 bytes of text and one image block of source.
func anthropicImage(source string) []byte {
	return []byte(`{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":` + source +
		`},{"type":"text","text":"1234"}]}]}`)
}

// openAIImage is an OpenAI request of 4 bytes of text and one image_url part.
func openAIImage(imageURL string) []byte {
	return []byte(`{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"1234"},` +
		`{"type":"image_url","image_url":` + imageURL + `}]}]}`)
}

// TestCount_Images: an image is input the provider bills by its size: Anthropic width × height /
// 750 after its resize (long edge at most 1568 px, about 1.2 megapixels at most: 1,600 tokens at
// most), OpenAI 85 at low detail, else 85 + 170 per 512-px tile once fitted in 2048 × 2048 and
// its short side brought down to 768. The count adds them to the text's tokens, the dimensions
// read from the base64 image's header.
func TestCount_Images(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		w, h int
		want int
	}{
		{200, 200, 54},     // 40,000 / 750 = 53.3
		{1000, 750, 1000},  // exactly 1,000
		{1092, 1092, 1590}, // Anthropic's largest square unresized
		{3136, 1568, 1600}, // long edge to 1568: 1568 × 784 = 1639 tokens, capped at 1,600
		{1568, 100, 210},   // 156,800 / 750 = 209.07
		{4000, 4000, 1600}, // scaled down to 1568 × 1568, capped at 1,600
	} {
		t.Run(fmt.Sprintf("Anthropic%dx%d", tc.w, tc.h), func(t *testing.T) {
			t.Parallel()
			body := anthropicImage(`{"type":"base64","media_type":"image/png","data":"` + pngBase64(t, tc.w, tc.h) + `"}`)
			r, err := tokens.Count(tokens.ProviderAnthropic, body)
			require.NoError(t, err)
			require.Equal(t, 4, r.TextBytes)
			require.Equal(t, tc.want, r.ImageTokens)
			require.Equal(t, 1+tc.want, r.Input)
		})
	}
	for _, tc := range []struct {
		w, h   int
		detail string
		want   int
	}{
		{1024, 1024, `"low"`, 85},
		{4000, 3000, `"low"`, 85},
		{512, 512, `"high"`, 85 + 170},     // not scaled up: one tile
		{1024, 1024, `"high"`, 85 + 4*170}, // short side to 768: 768 × 768, 4 tiles
		{2048, 4096, `"high"`, 85 + 6*170}, // 1024 × 2048, then 768 × 1536: 6 tiles
		{2048, 4096, `"auto"`, 85 + 6*170}, // auto is high
		{2048, 4096, `null`, 85 + 6*170},   // absent is auto
		{4096, 8192, `"high"`, 85 + 6*170}, // fitted in 2048 × 2048 first
		{768, 2048, `"high"`, 85 + 8*170},  // the most tiles: 2 × 4
		{100, 3000, `"high"`, 85 + 4*170},  // fitted to 68 × 2048: 1 × 4 tiles
	} {
		t.Run(fmt.Sprintf("OpenAI%dx%d%s", tc.w, tc.h, strings.Trim(tc.detail, `"`)), func(t *testing.T) {
			t.Parallel()
			body := openAIImage(`{"url":"data:image/png;base64,` + pngBase64(t, tc.w, tc.h) + `","detail":` + tc.detail + `}`)
			r, err := tokens.Count(tokens.ProviderOpenAI, body)
			require.NoError(t, err)
			require.Equal(t, 4, r.TextBytes)
			require.Equal(t, tc.want, r.ImageTokens)
			require.Equal(t, 1+tc.want, r.Input)
		})
	}
	t.Run("InToolResult", func(t *testing.T) {
		t.Parallel()
		body := []byte(`{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t",` +
			`"content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + pngBase64(t, 1000, 750) +
			`"}},{"type":"text","text":"1234"}]}]}]}`)
		r, err := tokens.Count(tokens.ProviderAnthropic, body)
		require.NoError(t, err)
		require.Equal(t, 4, r.TextBytes)
		require.Equal(t, 1000, r.ImageTokens)
	})
	t.Run("EscapedSlashes", func(t *testing.T) {
		t.Parallel()
		// A JSON encoder may write base64's '/' as "\/": the header still reads.
		data := strings.ReplaceAll(pngBase64(t, 1000, 750), "/", `\/`)
		r, err := tokens.Count(tokens.ProviderAnthropic,
			anthropicImage(`{"type":"base64","media_type":"image/png","data":"`+data+`"}`))
		require.NoError(t, err)
		require.Equal(t, 1000, r.ImageTokens)
	})
	t.Run("JPEGAndGIF", func(t *testing.T) {
		t.Parallel()
		img := image.NewGray(image.Rect(0, 0, 1000, 750))
		var j, g bytes.Buffer
		require.NoError(t, jpeg.Encode(&j, img, nil))
		require.NoError(t, gif.Encode(&g, img, nil))
		for name, b := range map[string][]byte{"JPEG": j.Bytes(), "GIF": g.Bytes()} {
			r, err := tokens.Count(tokens.ProviderAnthropic, anthropicImage(
				`{"type":"base64","media_type":"image/x","data":"`+base64.StdEncoding.EncodeToString(b)+`"}`))
			require.NoError(t, err, name)
			require.Equal(t, 1000, r.ImageTokens, name)
		}
	})
	t.Run("WebP", func(t *testing.T) {
		t.Parallel()
		for name, header := range map[string][]byte{
			// VP8X: 24-bit width - 1 and height - 1 at bytes 24 and 27.
			"VP8X": append([]byte("RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00"), 0xe7, 0x03, 0x00, 0xed, 0x02, 0x00),
			// VP8L: 0x2f, then 14 bits of width - 1 and 14 of height - 1.
			"VP8L": append([]byte("RIFF\x00\x00\x00\x00WEBPVP8L\x00\x00\x00\x00\x2f"), vp8l(1000, 750)...),
			// VP8: a key frame's start code, then 14-bit width and height.
			"VP8": append([]byte("RIFF\x00\x00\x00\x00WEBPVP8 \x00\x00\x00\x00\x00\x00\x00\x9d\x01\x2a"), 0xe8, 0x03, 0xee, 0x02),
		} {
			data := base64.StdEncoding.EncodeToString(append(header, make([]byte, 64)...))
			r, err := tokens.Count(tokens.ProviderAnthropic,
				anthropicImage(`{"type":"base64","media_type":"image/webp","data":"`+data+`"}`))
			require.NoError(t, err, name)
			require.Equal(t, 1000, r.ImageTokens, name)
		}
	})
}

// vp8l is a VP8L header's 4 bytes after its signature: width - 1 and height - 1, 14 bits each.
func vp8l(w, h int) []byte {
	v := uint32(w-1) | uint32(h-1)<<14
	return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)}
}

// TestCount_ImageDefaults: an image whose size the body does not tell (a URL, a file, a base64
// that is not an image llmq reads) counts the provider's most for one image, so that the
// reservation errs on the safe side; OpenAI's low detail is 85 whatever the image.
func TestCount_ImageDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, provider string
		body           []byte
		want           int
	}{
		{"AnthropicURL", tokens.ProviderAnthropic,
			anthropicImage(`{"type":"url","url":"https://example.com/a.png"}`), tokens.AnthropicMaxImageTokens},
		{"AnthropicFile", tokens.ProviderAnthropic,
			anthropicImage(`{"type":"file","file_id":"file_1"}`), tokens.AnthropicMaxImageTokens},
		{"AnthropicCorrupt", tokens.ProviderAnthropic,
			anthropicImage(`{"type":"base64","media_type":"image/png","data":"iVBORw0KGgoAAAANSUhEUgAA!!!"}`), tokens.AnthropicMaxImageTokens},
		{"AnthropicNotAnImage", tokens.ProviderAnthropic,
			anthropicImage(`{"type":"base64","media_type":"image/png","data":"` + base64.StdEncoding.EncodeToString([]byte("%PDF-1.7 not an image at all")) + `"}`),
			tokens.AnthropicMaxImageTokens},
		{"AnthropicTruncated", tokens.ProviderAnthropic,
			anthropicImage(`{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}`), tokens.AnthropicMaxImageTokens},
		{"AnthropicNoSource", tokens.ProviderAnthropic, anthropicImage(`null`), tokens.AnthropicMaxImageTokens},
		{"OpenAIURL", tokens.ProviderOpenAI,
			openAIImage(`{"url":"https://example.com/a.png"}`), tokens.OpenAIMaxImageTokens},
		{"OpenAIURLLow", tokens.ProviderOpenAI,
			openAIImage(`{"url":"https://example.com/a.png","detail":"low"}`), 85},
		{"OpenAICorrupt", tokens.ProviderOpenAI,
			openAIImage(`{"url":"data:image/png;base64,@@@@","detail":"high"}`), tokens.OpenAIMaxImageTokens},
		{"OpenAINotBase64", tokens.ProviderOpenAI,
			openAIImage(`{"url":"data:image/png,rawbytes"}`), tokens.OpenAIMaxImageTokens},
		{"OpenAINoURL", tokens.ProviderOpenAI, openAIImage(`{}`), tokens.OpenAIMaxImageTokens},
		{"OpenAINoImageURL", tokens.ProviderOpenAI, openAIImage(`null`), tokens.OpenAIMaxImageTokens},
		// Not the API's shape: counted, not refused (the provider judges it).
		{"OpenAIBareString", tokens.ProviderOpenAI,
			openAIImage(`"data:image/png;base64,` + pngBase64(t, 200, 200) + `"`), 85 + 170},
		{"OpenAIDetailNotAString", tokens.ProviderOpenAI,
			openAIImage(`{"url":"https://example.com/a.png","detail":7}`), tokens.OpenAIMaxImageTokens},
		{"OpenAIURLNotAString", tokens.ProviderOpenAI,
			openAIImage(`{"url":["x"],"detail":"high"}`), tokens.OpenAIMaxImageTokens},
	} {
		r, err := tokens.Count(tc.provider, tc.body)
		require.NoError(t, err, tc.name)
		require.Equal(t, 4, r.TextBytes, tc.name)
		require.Equal(t, tc.want, r.ImageTokens, tc.name)
		require.Equal(t, 1+tc.want, r.Input, tc.name)
		// An image of unknown size is reserved at the most but may be a small one: the least the
		// input can be leaves it out (a request is refused as too large only past that).
		if tc.want == 85 || tc.name == "OpenAIBareString" { // low detail, or a size read
			require.Equal(t, r.Input, r.MinInput, tc.name)
			require.Zero(t, r.UnknownImageTokens, tc.name)
		} else {
			require.Equal(t, 1, r.MinInput, tc.name)
			require.Equal(t, tc.want, r.UnknownImageTokens, tc.name)
		}
	}
	require.Equal(t, 1600, tokens.AnthropicMaxImageTokens)
	require.Equal(t, 85+8*170, tokens.OpenAIMaxImageTokens)
}

// TestCount_ImagesOfKnownSizeAreInTheLeast: an image whose size the body tells counts in the
// least the input can be (Request.MinInput), one of unknown size only in what is reserved
// (Input), also inside a tool result.
func TestCount_ImagesOfKnownSizeAreInTheLeast(t *testing.T) {
	t.Parallel()
	known := `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + pngBase64(t, 750, 100) + `"}}`
	url := `{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}`
	body := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[` + known + `,` + url +
		`,{"type":"tool_result","tool_use_id":"t","content":[` + url + `,` + known + `]},{"type":"text","text":"abcdefgh"}]}]}`
	r, err := tokens.Count(tokens.ProviderAnthropic, []byte(body))
	require.NoError(t, err)
	require.Equal(t, 2*100+2*tokens.AnthropicMaxImageTokens, r.ImageTokens)
	require.Equal(t, 2*tokens.AnthropicMaxImageTokens, r.UnknownImageTokens)
	require.Equal(t, r.TextBytes/tokens.BytesPerToken+r.ImageTokens, r.Input)
	require.Equal(t, r.Input-2*tokens.AnthropicMaxImageTokens, r.MinInput)
}

// TestCount_HugeImageNotDecoded: the size of a base64 image is read from its header; the image
// is never decoded whole. A 1000 × 750 PNG followed by 12 MB more (16 MB of base64) costs the
// count what a small one does, in bytes allocated.
func TestCount_HugeImageNotDecoded(t *testing.T) { // not parallel: it reads the process's allocations
	if raceEnabled {
		t.Skip("the race detector allocates for itself")
	}
	data := base64.StdEncoding.EncodeToString(append(pngBytes(t, 1000, 750), make([]byte, 12<<20)...))
	for provider, body := range map[string][]byte{
		tokens.ProviderAnthropic: anthropicImage(`{"type":"base64","media_type":"image/png","data":"` + data + `"}`),
		tokens.ProviderOpenAI:    openAIImage(`{"url":"data:image/png;base64,` + data + `"}`),
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		r, err := tokens.Count(provider, body)
		runtime.ReadMemStats(&after)
		require.NoError(t, err)
		require.Equal(t, map[string]int{tokens.ProviderAnthropic: 1000, tokens.ProviderOpenAI: 85 + 4*170}[provider],
			r.ImageTokens, provider)
		require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(256<<10), provider)
	}
}
