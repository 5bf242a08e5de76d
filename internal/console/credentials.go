package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/credstate"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/redisscript"
)

// CredentialState is one row of the credentials page: `ctl credentials list`'s figures, the
// token limits in force among them.
type CredentialState struct {
	Name     string `json:"name"`
	Provider string `json:"provider"`
	// Known is false until a worker published the credential's Redis tag: its shared state
	// cannot be found without (the API has no provider keys). The other fields are then empty.
	Known bool `json:"known"`
	credstate.State
}

// tag returns the credential's Redis tag as the workers published it; "" when none did.
func (h *Handler) tag(ctx context.Context, name string) (string, error) {
	t, err := h.cfg.Redis.HGet(ctx, redisscript.CredentialIndexKey(h.cfg.RedisPrefix), name).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", &apiError{status: http.StatusServiceUnavailable, typ: "unavailable", message: "Redis is unreachable; try again shortly"}
	}
	return t, nil
}

func (h *Handler) credentialState(ctx context.Context, c Credential) (CredentialState, error) {
	st := CredentialState{Name: c.Name, Provider: c.Provider,
		State: credstate.State{TokenLimits: []credstate.TokenLimit{}}}
	tag, err := h.tag(ctx, c.Name)
	if err != nil || tag == "" {
		return st, err
	}
	st.Known = true
	gate := h.limiter.GateByTag(tag, c.Name)
	if st.State, err = credstate.Read(ctx, gate, h.breaker.CircuitByTag(tag, c.Name),
		limiter.Limit{Rate: c.RequestsPerSecond, Burst: c.Burst}, credpause.NewStore(h.cfg.Pool, nil)); err != nil {
		return st, err
	}
	return st, nil
}

func (h *Handler) credentialList(w http.ResponseWriter, r *http.Request, _ *operator.Session) {
	out := make([]CredentialState, 0, len(h.cfg.Credentials))
	for _, c := range h.cfg.Credentials {
		st, err := h.credentialState(r.Context(), c)
		if err != nil {
			writeError(w, r, h.cfg.Logger, redisFailure(r, h, err))
			return
		}
		out = append(out, st)
	}
	writeJSON(w, http.StatusOK, map[string]any{"credentials": out})
}

// credentialResume ends the credential's pause and its Retry-After push-back, like
// `ctl credentials resume`. Its refusals quote the name (%q), which is the path's, any text.
func (h *Handler) credentialResume(w http.ResponseWriter, r *http.Request, s *operator.Session) {
	name := r.PathValue("name")
	var cred *Credential
	for i := range h.cfg.Credentials {
		if h.cfg.Credentials[i].Name == name {
			cred = &h.cfg.Credentials[i]
		}
	}
	if cred == nil {
		writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusNotFound, typ: "not_found", message: fmt.Sprintf("no credential %q in the config", name)})
		return
	}
	tag, err := h.tag(r.Context(), name)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	if tag == "" {
		writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusConflict, typ: "state_unknown", message: fmt.Sprintf("no worker has started with credential %q yet: it has no shared state to resume", name)})
		return
	}
	gate := h.limiter.GateByTag(tag, name)
	// Postgres keeps the pause too, so that it survives Redis losing its data.
	was, err := credpause.NewStore(h.cfg.Pool, nil).Resume(r.Context(), gate)
	if errors.Is(err, credpause.ErrDatabase) {
		h.cfg.Logger.WarnContext(r.Context(), "console: credential resume", "error", err)
		writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusServiceUnavailable, typ: "unavailable", message: "the database did not answer; try again shortly"})
		return
	}
	if err != nil {
		writeError(w, r, h.cfg.Logger, redisFailure(r, h, err))
		return
	}
	// The pause has ended: from here on the resume is audited, whether the push-back's clear
	// succeeds or not (a failure answers 503 after the entry).
	pb, pbErr := gate.ClearPushBack(r.Context())
	n, msg := 1, "credential "+name+" resumed"
	if !was && (pbErr != nil || !pb.Active()) {
		n, msg = 0, "credential "+name+" was neither paused nor pushed back"
	}
	entry := audit.Entry{Action: "credential.resume", Target: name, Count: n}
	if pbErr != nil {
		entry.Detail = map[string]any{"push_back": "not cleared"}
	}
	h.audit(r, s.Operator, entry)
	if pbErr != nil {
		writeError(w, r, h.cfg.Logger, redisFailure(r, h, pbErr))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"message": msg, "changed": n == 1})
}

// redisFailure turns a failure of the shared state's Redis into a 503 that says so (logged).
func redisFailure(r *http.Request, h *Handler, err error) error {
	var ae *apiError
	if errors.As(err, &ae) || errors.Is(err, context.Canceled) {
		return err
	}
	h.cfg.Logger.WarnContext(r.Context(), "console: credential state", "error", err)
	if errors.Is(err, credpause.ErrDatabase) { // a pause Redis lost, read from Postgres
		return &apiError{status: http.StatusServiceUnavailable, typ: "unavailable", message: "the database did not answer; try again shortly"}
	}
	return &apiError{status: http.StatusServiceUnavailable, typ: "unavailable", message: "the credentials' shared state (Redis) did not answer; try again shortly"}
}
