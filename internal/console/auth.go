package console

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/tenant"
)

// cookieName is the session cookie. Its Path keeps it off every route but the console's.
const cookieName = "llmq_console"

// csrfHeader carries the session's CSRF token on every state-changing request.
const csrfHeader = "X-CSRF-Token"

// sessionHandler is a handler that runs only for a live session.
type sessionHandler func(w http.ResponseWriter, r *http.Request, s *operator.Session)

// authed runs next for a request with a live session cookie: 401 without one. A request that
// changes state (any method but GET and HEAD) must also come from the console's own origin and
// carry the session's CSRF token: 403 otherwise. A bearer token, a tenant's or any other, is
// never a session.
func (h *Handler) authed(next sessionHandler) http.HandlerFunc {
	return h.authedWith(next, func(w http.ResponseWriter, r *http.Request, err error) { writeError(w, r, h.cfg.Logger, err) })
}

// liveAuthed is authed for a live page's event stream: a session lookup that fails for a reason
// that passes tells an EventSource to come back (refuseStream).
func (h *Handler) liveAuthed(next sessionHandler) http.HandlerFunc {
	return h.authedWith(next, h.refuseStream)
}

// authedWith is authed, answering a lookup's failure with refuse.
func (h *Handler) authedWith(next sessionHandler, refuse func(http.ResponseWriter, *http.Request, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := r.Cookie(cookieName)
		if err != nil {
			msg := "log in with an operator token (ctl operators create NAME)"
			if r.Header.Get("Authorization") != "" {
				msg = "the console does not take bearer tokens: " + msg
			}
			writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusUnauthorized, typ: "unauthorized", message: msg})
			return
		}
		// Bounded here too for the event streams, whose context no read's bound may end.
		ctx, cancel := h.readCtx(r.Context())
		sess, err := h.lookupSession(ctx, w, c.Value)
		cancel()
		if errors.Is(err, operator.ErrNoSession) {
			writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusUnauthorized, typ: "session_expired", message: "your session ended; log in again"})
			return
		}
		if err != nil {
			refuse(w, r, err)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if err := checkCSRF(r, sess); err != nil {
				writeError(w, r, h.cfg.Logger, err)
				return
			}
		}
		next(w, r, sess)
	}
}

// sessionEnded reports whether the session whose cookie opened the event stream r has ended
// since (logout, expiry, its operator revoked). A failed read is not an end: the stream's next
// pass asks again.
func (h *Handler) sessionEnded(r *http.Request) bool {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return true
	}
	ctx, cancel := h.readCtx(r.Context())
	defer cancel()
	_, err = h.lookupSession(ctx, nil, c.Value)
	return errors.Is(err, operator.ErrNoSession)
}

// lookupSession returns the live session of a session token (operator.Store.Session), its
// lookup within a place of the credential lookups' (lookupGate) unless the token was found live
// before. Past the gate's wait it is errLookupsFull, with Retry-After set on w (when not nil).
func (h *Handler) lookupSession(ctx context.Context, w http.ResponseWriter, token string) (*operator.Session, error) {
	release, err := h.lookups.enter(ctx, true, token)
	if err != nil {
		if w != nil && errors.Is(err, errLookupsFull) {
			w.Header().Set("Retry-After", "1")
		}
		return nil, err
	}
	defer release()
	sess, err := h.operators.Session(ctx, token)
	switch {
	case err == nil:
		h.lookups.found(token, true)
	case errors.Is(err, operator.ErrNoSession):
		h.lookups.found(token, false)
	}
	return sess, err
}

// endStream ends an event stream whose session ended with a "session_expired" event, on which
// the page shows the login.
func endStream(out *streamWriter) {
	if _, err := io.WriteString(out, "event: session_expired\ndata: {}\n\n"); err == nil {
		_ = out.flush()
	}
}

// checkCSRF requires the session's CSRF token in the header, given once, and, when the browser
// names the request's origin, the console's own. A header given more than once is refused
// whatever its values: read first, a token that a proxy or script appended to would pass.
func checkCSRF(r *http.Request, sess *operator.Session) error {
	if err := sameOrigin(r); err != nil {
		return err
	}
	values := r.Header.Values(csrfHeader)
	if len(values) > 1 {
		return &apiError{status: http.StatusForbidden, typ: "csrf",
			message: fmt.Sprintf("this action carries the %s header %d times: send it once", csrfHeader, len(values))}
	}
	got := ""
	if len(values) == 1 {
		got = values[0]
	}
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(sess.CSRF)) != 1 {
		return &apiError{status: http.StatusForbidden, typ: "csrf", message: "this action lacks the page's CSRF token; reload the console"}
	}
	return nil
}

// sameOrigin refuses a request whose Origin header names another host (browsers send it on
// every cross-site POST).
func sameOrigin(r *http.Request) error {
	o := r.Header.Get("Origin")
	if o == "" {
		return nil
	}
	u, err := url.Parse(o)
	if err != nil || !strings.EqualFold(u.Host, r.Host) {
		return &apiError{status: http.StatusForbidden, typ: "cross_origin", message: "this action came from another site"}
	}
	return nil
}

type loginRequest struct {
	Token string `json:"token"`
}

// sessionAnswer is what the page learns of its session: who, and the CSRF token to send.
type sessionAnswer struct {
	Operator string    `json:"operator"`
	CSRF     string    `json:"csrf_token"`
	Expires  time.Time `json:"expires_at"`
}

// login exchanges an operator token for a session cookie. A tenant's bearer token is refused
// with a message saying so.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	var req loginRequest
	if err := readJSON(r, &req); err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	token := strings.TrimSpace(req.Token)
	// A login looks its token up within a place of the credential lookups' (lookupGate): anybody
	// can send one, made up.
	release, err := h.lookups.enter(r.Context(), false, token)
	if err != nil {
		if errors.Is(err, errLookupsFull) {
			w.Header().Set("Retry-After", "1")
		}
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	sessionToken, sess, err := h.operators.Login(r.Context(), token, h.cfg.SessionTTL)
	release()
	switch {
	case err == nil:
	case strings.HasPrefix(token, tenant.BearerTokenPrefix):
		writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusUnauthorized, typ: "tenant_token", message: "that is a tenant's API token; the console takes an operator token (ctl operators create NAME)"})
		return
	case errors.Is(err, operator.ErrMalformedToken), errors.Is(err, operator.ErrUnknownToken):
		writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusUnauthorized, typ: "invalid_token", message: "unknown operator token"})
		return
	case errors.Is(err, operator.ErrRevoked):
		// A token that should be out of use is in use: an operator security event, logged (who
		// and why, never the token), as the tenants' revoked keys are by the API: once per
		// LoginLogInterval and operator, a script retrying the token must not flood the log
		// (those held back are counted in a line of their own once it has passed:
		// loginsSuppressed).
		var revoked *operator.RevokedError
		name := ""
		if errors.As(err, &revoked) {
			name = revoked.Operator
		}
		attrs := []any{"operator", name, "reason", operator.ErrRevoked.Error(),
			"remote_addr", r.RemoteAddr}
		if log, suppressed := h.loginLog.Allow(name, attrs...); log {
			h.cfg.Logger.WarnContext(r.Context(), msgLoginRefused,
				append(attrs, "suppressed", suppressed)...)
		}
		writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusForbidden, typ: "operator_revoked", message: "this operator was revoked"})
		return
	default:
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	// The session is live: its requests are looked up without a place from the first, so that
	// an operator who logs in during a flood of made-up credentials keeps the console.
	h.lookups.found(sessionToken, true)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: sessionToken, Path: Prefix, Expires: sess.Expires,
		HttpOnly: true, Secure: overTLS(r), SameSite: http.SameSiteStrictMode})
	h.audit(r, sess.Operator, audit.Entry{Action: "login", Count: 1})
	writeJSON(w, http.StatusOK, sessionAnswer{Operator: sess.Operator, CSRF: sess.CSRF, Expires: sess.Expires})
}

// LoginLogInterval is how often a revoked operator's refused login may be logged (the API's
// interval for a revoked tenant's token).
const LoginLogInterval = time.Minute

// msgLoginRefused is the message of a revoked operator's refused login, which its report repeats.
const msgLoginRefused = "console: login refused"

// loginsSuppressed logs the refused logins of operator that the login log held back and no line
// of the operator counted since (loginLog's Report): the last minute of a script that then
// stopped. The line is the last one held back's (its remote_addr), counting them all.
func (h *Handler) loginsSuppressed(_ string, _ slog.Level, suppressed int, last []any) {
	h.cfg.Logger.Warn(msgLoginRefused, append(slices.Clip(last), "suppressed", suppressed)...)
}

// overTLS reports whether the browser reached the console over TLS: directly, or through a
// proxy that ended TLS and says so (X-Forwarded-Proto: https). Trusting the header is safe here:
// a client that lies about it only gets a cookie its own browser will not send back over HTTP.
func overTLS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// logout ends the session (with its CSRF token: a cross-site page cannot log an operator out)
// and clears the cookie.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	h.authed(func(w http.ResponseWriter, r *http.Request, s *operator.Session) {
		c, _ := r.Cookie(cookieName)
		if err := h.operators.Logout(r.Context(), c.Value); err != nil {
			writeError(w, r, h.cfg.Logger, err)
			return
		}
		http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: Prefix, MaxAge: -1,
			HttpOnly: true, Secure: overTLS(r), SameSite: http.SameSiteStrictMode})
		h.audit(r, s.Operator, audit.Entry{Action: "logout", Count: 1})
		writeJSON(w, http.StatusOK, map[string]string{"status": "logged out"})
	})(w, r)
}

func (h *Handler) session(w http.ResponseWriter, _ *http.Request, s *operator.Session) {
	writeJSON(w, http.StatusOK, sessionAnswer{Operator: s.Operator, CSRF: s.CSRF, Expires: s.Expires})
}

// audit records an action done; a failure to record it is logged (the action happened).
func (h *Handler) audit(r *http.Request, op string, e audit.Entry) {
	e.Operator = op
	// Written even when the client has gone: the action was done.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	if _, err := audit.Log(ctx, h.cfg.Pool, e); err != nil {
		h.cfg.Logger.ErrorContext(r.Context(), "console: write audit log", "operator", op, "action", e.Action, "error", err)
	}
}
