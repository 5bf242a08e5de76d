package console

import (
	"net/http"
	"slices"
	"strings"

	"github.com/llmq/llmq/internal/logthrottle"
)

// Routes returns every operation h serves, "METHOD pattern" (http.ServeMux's patterns), HEAD
// included where a GET route serves it.
func Routes(h *Handler) []string {
	var out []string
	for _, p := range h.patterns {
		out = append(out, p)
		if method, path, _ := strings.Cut(p, " "); method == http.MethodGet && !slices.Contains(streams, path) {
			out = append(out, http.MethodHead+" "+path)
		}
	}
	return out
}

// Shorten is shorten, for its tests.
var Shorten = shorten

// SetLoginLogAfterFunc makes f schedule the reports of h's refused logins' lines held back
// (logthrottle.Throttle.SetAfterFunc).
func SetLoginLogAfterFunc(h *Handler, f logthrottle.TimerFunc) { h.loginLog.SetAfterFunc(f) }
