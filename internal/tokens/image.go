package tokens

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"image"
	_ "image/gif" // image.DecodeConfig reads a GIF's header
	_ "image/jpeg"
	_ "image/png"
	"io"
)

// AnthropicMaxImageTokens is the most one image costs on Anthropic's Messages API (width × height
// / 750 once resized to a long edge of at most 1568 px and about 1.2 megapixels), and what an
// image whose size the body does not tell counts (a URL or file source, a base64 image llmq cannot
// read): a reservation that errs on the safe side.
const AnthropicMaxImageTokens = 1600

// OpenAI's image costs (Chat Completions, the GPT-4o family's tiles): a low-detail image costs
// openAILowImageTokens, a high-detail one openAILowImageTokens plus openAITileTokens per 512-px
// tile.
const (
	openAILowImageTokens = 85
	openAITileTokens     = 170
)

// OpenAIMaxImageTokens is the most one image of high (or auto) detail costs on OpenAI's Chat
// Completions (fitted in 2048 × 2048, its short side brought down to 768 px: 2 × 4 tiles of 512
// px, 170 tokens each, plus 85), and what such an image whose size the body does not tell counts
// (a URL, a data URL llmq cannot read): a reservation that errs on the safe side.
const OpenAIMaxImageTokens = openAILowImageTokens + 8*openAITileTokens

// maxImageHeader bounds the bytes of a base64 image decoded to find its size: a PNG's, a GIF's
// and a WebP's are in its first 30 bytes, a JPEG's after its APP segments (EXIF, ICC profile,
// a thumbnail), which seldom pass 64 KB. Past it, the image counts the provider's maximum.
const maxImageHeader = 128 << 10

// imageSize is an image's width and height in pixels, both 0 when unknown.
type imageSize struct{ w, h int }

// known reports whether the size was read.
func (s imageSize) known() bool { return s.w > 0 && s.h > 0 }

// anthropicImageTokens is what Anthropic bills for an image of size s: width × height / 750
// (rounded up), once scaled down to a long edge of 1568 px, and at most AnthropicMaxImageTokens
// (its resize to about 1.2 megapixels); AnthropicMaxImageTokens when s is unknown.
func anthropicImageTokens(s imageSize) int {
	if !s.known() {
		return AnthropicMaxImageTokens
	}
	w, h := float64(s.w), float64(s.h)
	if long := max(w, h); long > 1568 {
		w, h = w*1568/long, h*1568/long
	}
	return min(int(ceilDiv(w*h, 750)), AnthropicMaxImageTokens)
}

// openAIImageTokens is what OpenAI's Chat Completions bills for an image of size s at detail:
// 85 at "low"; else (high, auto or absent) fitted in 2048 × 2048, its short side brought down to
// 768 (a smaller image is not scaled up), 170 per 512-px tile plus 85. OpenAIMaxImageTokens when
// s is unknown.
func openAIImageTokens(s imageSize, detail string) int {
	if detail == "low" {
		return openAILowImageTokens
	}
	if !s.known() {
		return OpenAIMaxImageTokens
	}
	w, h := float64(s.w), float64(s.h)
	if long := max(w, h); long > 2048 {
		w, h = float64(int(w*2048/long)), float64(int(h*2048/long))
	}
	if short := min(w, h); short > 768 {
		w, h = float64(int(w*768/short)), float64(int(h*768/short))
	}
	tiles := int(ceilDiv(max(w, 1), 512) * ceilDiv(max(h, 1), 512))
	return openAILowImageTokens + tiles*openAITileTokens
}

// ceilDiv is ⌈a / b⌉ for positive a and b.
func ceilDiv(a, b float64) float64 {
	q := a / b
	if n := float64(int64(q)); n < q {
		return n + 1
	}
	return q
}

// imagePart is an OpenAI image part's image_url: an object of a url and a detail. Any other
// value (a bare string, as early clients sent, or a detail that is not a string) is not refused
// here: it counts as an image of unknown size (the provider judges it), its url read when a
// string.
type imagePart struct {
	url    dataURL
	detail string
}

// UnmarshalJSON implements json.Unmarshaler.
func (p *imagePart) UnmarshalJSON(raw []byte) error {
	*p = imagePart{}
	if isString(raw) {
		return p.url.UnmarshalJSON(raw)
	}
	var f struct {
		URL    dataURL `json:"url"`
		Detail string  `json:"detail"`
	}
	if json.Unmarshal(raw, &f) == nil {
		p.url, p.detail = f.URL, f.Detail
	}
	return nil
}

// dataURL is an OpenAI image_url's url: the size of the image of a base64 data URL, read where
// it lies in the body (unknown for any other URL).
type dataURL struct{ size imageSize }

// UnmarshalJSON implements json.Unmarshaler.
func (u *dataURL) UnmarshalJSON(raw []byte) error {
	u.size = imageSize{}
	if !isString(raw) || !bytes.HasPrefix(raw, []byte(`"data:`)) {
		return nil // a URL, or no string: the provider judges it
	}
	// data:[<media type>][;base64],<data>: the media type is short.
	head := raw[:min(len(raw), 256)]
	comma := bytes.IndexByte(head, ',')
	if comma < 0 || !bytes.HasSuffix(head[:comma], []byte(";base64")) {
		return nil
	}
	u.size = base64ImageSize(raw[comma+1 : len(raw)-1])
	return nil
}

// sourceData is the value of a content block's source "data": its length as decoded text (a text
// document's), and, when it begins as a base64 PNG, JPEG, GIF or WebP does, the image's size (an
// image's). Both are read where the data lies in the body: neither is copied.
type sourceData struct {
	n    int
	size imageSize
}

// base64Magic are the base64 beginnings of the images whose size is read: PNG, JPEG (its '/'
// written as is or escaped), GIF and WebP (a RIFF file).
var base64Magic = [][]byte{[]byte("iVBORw0KGgo"), []byte("/9j/"), []byte(`\/9j\/`),
	[]byte("R0lGOD"), []byte("UklGR")}

// UnmarshalJSON implements json.Unmarshaler.
func (d *sourceData) UnmarshalJSON(raw []byte) error {
	*d = sourceData{n: decodedLen(raw)}
	if !isString(raw) {
		return nil
	}
	s := raw[1 : len(raw)-1]
	for _, m := range base64Magic {
		if bytes.HasPrefix(s, m) {
			d.size = base64ImageSize(s)
			break
		}
	}
	return nil
}

// base64ImageSize reads the size of the image whose base64 is s, JSON string text (no quotes),
// from its header: at most maxImageHeader bytes are decoded, whatever the image's size.
// Unknown (zero) when s is not base64 of a PNG, JPEG, GIF or WebP image that reads.
func base64ImageSize(s []byte) imageSize {
	r := io.LimitReader(base64.NewDecoder(base64.StdEncoding, &jsonText{s: s}), maxImageHeader)
	var head [30]byte
	n, _ := io.ReadFull(r, head[:])
	if size, ok := webpSize(head[:n]); ok {
		return size
	}
	cfg, _, err := image.DecodeConfig(io.MultiReader(bytes.NewReader(head[:n]), r))
	if err != nil {
		return imageSize{}
	}
	return imageSize{w: cfg.Width, h: cfg.Height}
}

// webpSize reads a WebP image's size from its first 30 bytes: a RIFF header, then a VP8X chunk
// (the canvas's 24-bit width and height, less one), a VP8L one (after its 0x2f signature, 14 bits
// each, less one) or a VP8 one (a key frame: after its start code, 14 bits each). ok is false
// for anything else.
func webpSize(b []byte) (imageSize, bool) {
	if len(b) < 30 || string(b[:4]) != "RIFF" || string(b[8:12]) != "WEBP" {
		return imageSize{}, false
	}
	var s imageSize
	switch string(b[12:16]) {
	case "VP8X":
		s = imageSize{w: int(le24(b[24:27])) + 1, h: int(le24(b[27:30])) + 1}
	case "VP8L":
		if b[20] != 0x2f {
			return imageSize{}, false
		}
		v := binary.LittleEndian.Uint32(b[21:25])
		s = imageSize{w: int(v&0x3fff) + 1, h: int(v>>14&0x3fff) + 1}
	case "VP8 ":
		if b[23] != 0x9d || b[24] != 0x01 || b[25] != 0x2a {
			return imageSize{}, false
		}
		s = imageSize{w: int(binary.LittleEndian.Uint16(b[26:28]) & 0x3fff),
			h: int(binary.LittleEndian.Uint16(b[28:30]) & 0x3fff)}
	default:
		return imageSize{}, false
	}
	return s, s.known()
}

// le24 reads a 24-bit little-endian integer.
func le24(b []byte) uint32 { return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 }

// errEscape is jsonText's error for an escape that base64 has no use for.
var errEscape = errors.New("escape in base64 text")

// jsonText reads JSON string text (no quotes) as the bytes it decodes to, for base64: "\/" is
// '/', the escaped line breaks a MIME encoder writes ("\n", "\r") are passed over, and any other
// escape is an error.
type jsonText struct{ s []byte }

// Read implements io.Reader.
func (t *jsonText) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && len(t.s) > 0 {
		c := t.s[0]
		if c != '\\' {
			i := bytes.IndexByte(t.s[:min(len(t.s), len(p)-n)], '\\')
			if i < 0 {
				i = min(len(t.s), len(p)-n)
			}
			n += copy(p[n:], t.s[:i])
			t.s = t.s[i:]
			continue
		}
		if len(t.s) < 2 {
			return n, errEscape
		}
		switch t.s[1] {
		case '/':
			p[n] = '/'
			n++
		case 'n', 'r':
		default:
			return n, errEscape
		}
		t.s = t.s[2:]
	}
	if n == 0 && len(t.s) == 0 {
		return 0, io.EOF
	}
	return n, nil
}
