package llmsim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"image"
	_ "image/gif" // image.DecodeConfig reads a GIF's size
	_ "image/jpeg"
	_ "image/png"
	"math"
	"strings"
)

// The providers' image bills, as the package doc gives them: Anthropic's most for one image, and
// OpenAI's low-detail image, its 512-px tile and its most for one high-detail image (2 × 4 tiles).
const (
	anthropicMaxImage = 1600
	openAILowImage    = 85
	openAITile        = 170
	openAIMaxImage    = openAILowImage + 8*openAITile
)

// blockSource is the source of an Anthropic "image" or "document" block: its type ("base64",
// "url", "file", a document's "text" or "content"), its data, and a content document's content.
type blockSource struct {
	Type    string          `json:"type"`
	Data    json.RawMessage `json:"data"`
	Content json.RawMessage `json:"content"`
}

// anthropicImage is the input tokens of an Anthropic "image" block: width × height / 750, rounded
// up, once its long edge is brought down to 1568 px, at most anthropicMaxImage; an image whose size
// the body does not tell (a URL or a file, data that does not read) anthropicMaxImage.
func anthropicImage(src *blockSource) int {
	w, h, ok := 0, 0, false
	var data string
	if src != nil && src.Type == "base64" && json.Unmarshal(src.Data, &data) == nil {
		w, h, ok = base64ImageSize(data)
	}
	if !ok {
		return anthropicMaxImage
	}
	fw, fh := float64(w), float64(h)
	if long := max(fw, fh); long > 1568 {
		fw, fh = fw*1568/long, fh*1568/long
	}
	return min(int(math.Ceil(fw*fh/750)), anthropicMaxImage)
}

// openAIImage is the input tokens of an OpenAI "image_url" part: openAILowImage at detail "low";
// else fitted in 2048 × 2048 and its short side brought down to 768 px, openAILowImage plus
// openAITile per 512-px tile; an image whose size the body does not tell (a URL, a data URL that
// does not read) openAIMaxImage.
func openAIImage(imageURL json.RawMessage) int {
	var part struct {
		URL    string `json:"url"`
		Detail string `json:"detail"`
	}
	if json.Unmarshal(imageURL, &part.URL) != nil {
		_ = unmarshalExact(imageURL, &part) // anything else: an image of unknown size
	}
	if part.Detail == "low" {
		return openAILowImage
	}
	w, h, ok := 0, 0, false
	if head, data, found := strings.Cut(part.URL, ","); found && strings.HasPrefix(head, "data:") &&
		strings.HasSuffix(head, ";base64") {
		w, h, ok = base64ImageSize(data)
	}
	if !ok {
		return openAIMaxImage
	}
	if long := max(w, h); long > 2048 {
		w, h = w*2048/long, h*2048/long
	}
	if short := min(w, h); short > 768 {
		w, h = w*768/short, h*768/short
	}
	tiles := (max(w, 1) + 511) / 512 * ((max(h, 1) + 511) / 512)
	return openAILowImage + tiles*openAITile
}

// base64ImageSize is the width and height of the PNG, JPEG, GIF or WebP image whose base64 is
// data (line breaks allowed); ok is false when it is none of them or does not read.
func base64ImageSize(data string) (w, h int, ok bool) {
	raw, err := base64.StdEncoding.DecodeString(strings.NewReplacer("\n", "", "\r", "").Replace(data))
	if err != nil {
		return 0, 0, false
	}
	if w, h, ok := webpImageSize(raw); ok {
		return w, h, true
	}
	cfg, _, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil || cfg.Width <= 0 || cfg.Height <= 0 {
		return 0, 0, false
	}
	return cfg.Width, cfg.Height, true
}

// webpImageSize reads a WebP image's canvas size (the standard library has no WebP decoder): a
// VP8X chunk's 24-bit sizes less one, a VP8L one's 14-bit sizes less one, a VP8 key frame's
// 14-bit sizes.
func webpImageSize(b []byte) (w, h int, ok bool) {
	if len(b) < 30 || string(b[:4]) != "RIFF" || string(b[8:12]) != "WEBP" {
		return 0, 0, false
	}
	switch string(b[12:16]) {
	case "VP8X":
		w = (int(b[24]) | int(b[25])<<8 | int(b[26])<<16) + 1
		h = (int(b[27]) | int(b[28])<<8 | int(b[29])<<16) + 1
	case "VP8L":
		if b[20] != 0x2f {
			return 0, 0, false
		}
		v := binary.LittleEndian.Uint32(b[21:25])
		w, h = int(v&0x3fff)+1, int(v>>14&0x3fff)+1
	case "VP8 ":
		if !bytes.Equal(b[23:26], []byte{0x9d, 0x01, 0x2a}) {
			return 0, 0, false
		}
		w = int(binary.LittleEndian.Uint16(b[26:28]) & 0x3fff)
		h = int(binary.LittleEndian.Uint16(b[28:30]) & 0x3fff)
	default:
		return 0, 0, false
	}
	return w, h, w > 0 && h > 0
}

// contentImages is the input tokens of the images of a content value that is an array of blocks
// (a tool result's, a document's): its "image" blocks and "image_url" parts; 0 for anything else.
func contentImages(raw json.RawMessage) int {
	var blocks []struct {
		Type     string          `json:"type"`
		Source   *blockSource    `json:"source"`
		ImageURL json.RawMessage `json:"image_url"`
	}
	if isNull(raw) || unmarshalExact(raw, &blocks) != nil {
		return 0
	}
	n := 0
	for _, bl := range blocks {
		n += imageTokens(bl.Type, bl.Source, bl.ImageURL)
	}
	return n
}

// imageTokens is the input tokens of a content block of type typ, source src and image_url
// imageURL: its image's, or 0 when it is no image.
func imageTokens(typ string, src *blockSource, imageURL json.RawMessage) int {
	switch typ {
	case "image":
		return anthropicImage(src)
	case "image_url":
		return openAIImage(imageURL)
	}
	return 0
}
