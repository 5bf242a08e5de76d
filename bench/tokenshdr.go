package main

import (
	"net/http"
	"strings"
)

// hideTokenHeaders wraps next so that its answers carry no token rate-limit headers (see
// isTokenHeader): a client behind it sees the request limit only, as before providers' token
// headers were read. Everything else (status, body, retry-after, the request-limit headers,
// flushing) passes through. Safe for concurrent use if next is.
func hideTokenHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&tokenHeaderStripper{ResponseWriter: w}, r)
	})
}

// isTokenHeader reports whether the header name is one of the providers' token rate-limit
// headers: Anthropic's anthropic-ratelimit-{input-tokens,output-tokens,tokens}-{limit,remaining,reset}
// (any anthropic-ratelimit-*tokens-*) and OpenAI's x-ratelimit-{limit,remaining,reset}-tokens
// (any x-ratelimit-*-tokens). Request-limit headers are not. Case-insensitive.
func isTokenHeader(name string) bool {
	n := strings.ToLower(name)
	if rest, ok := strings.CutPrefix(n, "anthropic-ratelimit-"); ok {
		return strings.HasPrefix(rest, "tokens-") || strings.Contains(rest, "-tokens-")
	}
	if rest, ok := strings.CutPrefix(n, "x-ratelimit-"); ok {
		return strings.HasSuffix(rest, "-tokens")
	}
	return false
}

// stripTokenHeaders deletes the token rate-limit headers from h.
func stripTokenHeaders(h http.Header) {
	for k := range h {
		if isTokenHeader(k) {
			delete(h, k)
		}
	}
}

// tokenHeaderStripper removes the token headers just before the header is written.
type tokenHeaderStripper struct {
	http.ResponseWriter
	wrote bool
}

// WriteHeader strips the token headers, then writes the header.
func (w *tokenHeaderStripper) WriteHeader(code int) {
	stripTokenHeaders(w.Header())
	if code >= 200 {
		w.wrote = true
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write writes the header first (200) if it was not written yet.
func (w *tokenHeaderStripper) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer (Flush).
func (w *tokenHeaderStripper) Unwrap() http.ResponseWriter { return w.ResponseWriter }
