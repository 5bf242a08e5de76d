package llm_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// hostileKey has characters URL escaping changes (+, /, =) and both letter cases, so that each
// of its forms differs from the others.
const hostileKey = "sk-ant-api03-Zq9+Xv/Wy7=Kp2Lm4Nb6Vc8Ht1Rj3Fd5Gs0Q"

// window is the length of the key material the assertion looks for: no output may hold 8
// consecutive characters of any form of the key.
const window = 8

// keyForms are the texts a provider or a proxy may echo the key as: as sent, in another letter
// case, URL-escaped, base64 alone (padded or raw, both alphabets) and base64 inside a longer text
// at the two other alignments (a Bearer header, a Basic credential, encoded whole).
func keyForms(key string) map[string]string {
	forms := map[string]string{"Raw": key, "Lower": strings.ToLower(key), "Upper": strings.ToUpper(key),
		"QueryEscaped": url.QueryEscape(key), "PathEscaped": url.PathEscape(key)}
	for name, enc := range map[string]*base64.Encoding{"Std": base64.StdEncoding, "URL": base64.URLEncoding} {
		forms["Base64"+name] = enc.EncodeToString([]byte(key))
		forms["Base64"+name+"Raw"] = enc.WithPadding(base64.NoPadding).EncodeToString([]byte(key))
		forms["Base64"+name+"Bearer"] = enc.EncodeToString([]byte("Bearer " + key))
		forms["Base64"+name+"Basic"] = enc.EncodeToString([]byte("u:" + key))
	}
	return forms
}

// keyMaterial is every lower-cased window of text that only the key determines: of the key, of
// its URL escapes and base64 encodings, and of its base64 encoding inside a longer text, at each
// alignment (the characters that do not change when every bit around the key is flipped).
func keyMaterial(key string) map[string]bool {
	m := map[string]bool{}
	add := func(s string) {
		s = strings.ToLower(s)
		for i := 0; i+window <= len(s); i++ {
			m[s[i:i+window]] = true
		}
	}
	add(key)
	add(url.QueryEscape(key))
	add(url.PathEscape(key))
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		add(enc.EncodeToString([]byte(key)))
		for shift := range 3 {
			a := enc.EncodeToString([]byte(strings.Repeat("\x00", shift) + key + "\x00\x00\x00"))
			b := enc.EncodeToString([]byte(strings.Repeat("\xff", shift) + key + "\xff\xff\xff"))
			start := -1
			for i := 0; i <= len(a); i++ {
				same := i < len(a) && a[i] == b[i]
				switch {
				case same && start < 0:
					start = i
				case !same && start >= 0:
					add(a[start:i])
					start = -1
				}
			}
		}
	}
	return m
}

// leaked returns the first window of key material found in any of texts, ignoring case.
func leaked(material map[string]bool, texts []string) (string, bool) {
	for _, s := range texts {
		s = strings.ToLower(s)
		for i := 0; i+window <= len(s); i++ {
			if material[s[i:i+window]] {
				return s[i : i+window], true
			}
		}
	}
	return "", false
}

// providerTexts is every text a Send's outcome carries that came from the provider: the error
// string, each field of a *StatusError, the header names and values and body of either, and the
// malformed Retry-After value that classifying the error keeps for a log line.
func providerTexts(resp *llm.Response, err error) []string {
	texts := []string{retrypolicy.Classify(err, time.Now()).RetryAfterValue}
	headers := func(h http.Header) {
		for k, vs := range h {
			texts = append(texts, k)
			texts = append(texts, vs...)
		}
	}
	if err != nil {
		texts = append(texts, err.Error())
	}
	if se, ok := errors.AsType[*llm.StatusError](err); ok {
		texts = append(texts, se.Message, se.Type, se.Code, se.ErrorType())
		headers(se.Header)
	}
	if resp != nil {
		texts = append(texts, string(resp.Body))
		headers(resp.Header)
	}
	return texts
}

// cannedProvider is a Provider whose every call gets the answer (or the transport error) that
// answer builds, without a network.
func cannedProvider(t *testing.T, key string, answer func() (*http.Response, error)) llm.Provider {
	t.Helper()
	p, err := llm.New(llm.Config{Kind: llm.KindOpenAI, BaseURL: "http://provider.test", APIKey: key,
		HTTPClient: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := answer()
			if resp != nil {
				resp.Request = r
			}
			return resp, err
		})}})
	require.NoError(t, err)
	return p
}

// transportPrefix is how a transport error's text starts before what the server sent.
const transportPrefix = `llm: send request: Post "http://provider.test/v1/chat/completions": net/http: malformed HTTP response "`

func canned(status int, body string, kv ...string) *http.Response {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
}

// Provider text is untrusted: whatever a provider sends back, with the key in any form at any
// offset around each place where its text is cut (the excerpt of a body, the old excerpt
// window, the read limit of an error body, a JSON message, an error type or code, a Content-Type,
// a transport error), nothing that Send returns holds 8 consecutive characters of any form of the
// key. A provider configured without a key shows that each flow does expose the text: without
// redaction, the key would be there.
func TestProvider_Send_KeyNeverSurvives(t *testing.T) {
	t.Parallel()

	material := keyMaterial(hostileKey)
	type flow struct {
		name   string
		cut    int // the offset of the cut the key straddles
		answer func(text []byte) (*http.Response, error)
		fill   byte // filler around the key: a character no form of the key contains
		total  int  // the provider text's length
	}
	jsonErr := func(field string) func([]byte) (*http.Response, error) {
		return func(text []byte) (*http.Response, error) {
			fields := map[string]string{"message": "m", "type": "t", "code": "c"}
			fields[field] = string(text)
			return canned(401, fmt.Sprintf(`{"error":{"message":%q,"type":%q,"code":%q}}`,
				fields["message"], fields["type"], fields["code"])), nil
		}
	}
	textErr := func(text []byte) (*http.Response, error) {
		resp := canned(502, "", "Content-Type", "text/html")
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(text)), int64(len(text))
		return resp, nil
	}
	flows := []flow{
		{name: "ErrorBodyExcerpt", cut: 200, answer: textErr, fill: '~', total: 1000},
		{name: "ErrorBodyExcerptWhiteSpace", cut: 200, answer: textErr, fill: ' ', total: 1000},
		{name: "ErrorBodyOldWindow", cut: 800, answer: textErr, fill: ' ', total: 1000},
		{name: "ErrorBodyReadLimit", cut: 64 << 10, answer: textErr, fill: ' ', total: 64<<10 + 100},
		{name: "ErrorJSONMessage", cut: 512, answer: jsonErr("message"), fill: '~', total: 1000},
		{name: "ErrorJSONType", cut: 128, answer: jsonErr("type"), fill: '~', total: 300},
		{name: "ErrorJSONCode", cut: 128, answer: jsonErr("code"), fill: '~', total: 300},
		{name: "UndecodableOKContentType", cut: 128, fill: '~', total: 300, answer: func(text []byte) (*http.Response, error) {
			return canned(200, "<html>not json</html>", "Content-Type", "text/html; "+string(text)), nil
		}},
		{name: "Header", cut: 64, fill: '~', total: 300, answer: func(text []byte) (*http.Response, error) {
			return canned(429, `{}`, "X-Echo", string(text), "X-"+strings.Trim(string(text), "~")+"-Echo", "1",
				"Retry-After", string(text)), nil
		}},
		{name: "OKBody", cut: 0, fill: '~', total: 300, answer: func(text []byte) (*http.Response, error) {
			return canned(200, `{"content":[{"type":"text","text":"`+string(text)+`"}]}`), nil
		}},
		// The error's text is cut at 512 bytes, its prefix (the operation and the URL) included.
		{name: "TransportError", cut: 512 - len(transportPrefix), fill: '~', total: 1000, answer: func(text []byte) (*http.Response, error) {
			return nil, fmt.Errorf("net/http: malformed HTTP response %q", text)
		}},
	}
	for _, fl := range flows {
		t.Run(fl.name, func(t *testing.T) {
			t.Parallel()

			// text is what the provider sends this time: filler with a form of the key at some offset.
			// One buffer serves every offset (the largest flow sends 64 KiB a call).
			text, fill := make([]byte, fl.total), bytes.Repeat([]byte{fl.fill}, fl.total)
			answer := func() (*http.Response, error) { return fl.answer(text) }
			withKey, withoutKey := cannedProvider(t, hostileKey, answer), cannedProvider(t, "", answer)
			exposed := false
			for name, form := range keyForms(hostileKey) {
				for at := max(fl.cut-len(form)-1, 0); at <= fl.cut+1; at++ {
					copy(text, fill)
					copy(text[at:], form)
					resp, err := withKey.Send(t.Context(), bodyFor(llm.KindOpenAI), llm.SendOptions{})
					if w, ok := leaked(material, providerTexts(resp, err)); ok {
						t.Fatalf("form %s at offset %d: %q of the key survived in %q", name, at, w, providerTexts(resp, err))
					}
					if !exposed {
						resp, err = withoutKey.Send(t.Context(), bodyFor(llm.KindOpenAI), llm.SendOptions{})
						_, exposed = leaked(material, providerTexts(resp, err))
					}
				}
			}
			require.True(t, exposed, "without a key to redact, the flow exposes the key: the test exercises it")
		})
	}
}
