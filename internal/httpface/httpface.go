// Package httpface is the plane's small HTTP face: closed route tables matched on the exact
// path, JSON everywhere, no CORS headers ever.
package httpface

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/cotal-ai/authplane/internal/fault"
)

// Health says whether the plane can serve now, and if not, why.
type Health func(ctx context.Context) (ok bool, reason string)

// Loopback returns the handler of the loopback listener (always on, 127.0.0.1).
func Loopback(issuer string, healthy Health) http.Handler {
	routes := map[string]http.HandlerFunc{
		"/health":                    health(issuer, healthy),
		"/jwks":                      unimplemented,
		"/exchange":                  unimplemented,
		"/manager-service-authority": unimplemented,
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Exact match on the raw path: no cleaning, no trailing-slash redirects, no queries.
		h, ok := routes[r.URL.RawPath]
		if r.URL.RawPath == "" {
			h, ok = routes[r.URL.Path]
		}
		if !ok || r.URL.RawQuery != "" || r.URL.ForceQuery {
			writeError(w, fault.New(fault.NotFound, "unknown path - /health, /jwks, /exchange, /manager-service-authority"))
			return
		}
		h(w, r)
	})
}

// health answers `{ok:true, issuer}`, or 503 `{ok:false, reason}` while the plane cannot serve
// (disconnected, fenced, draining, its gate unreadable): what a load balancer or an operator
// polls must not say ok for a plane that would answer nothing.
func health(issuer string, healthy Health) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			// The HTTP face's own method guard (DESIGN §7), not a refusal of the table.
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "GET only", "code": string(fault.BadRequest)})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if ok, reason := healthy(ctx); !ok {
			writeJSON(w, fault.Unavailable.HTTPStatus(), map[string]any{"ok": false, "reason": reason})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "issuer": issuer})
	}
}

func unimplemented(w http.ResponseWriter, _ *http.Request) {
	writeError(w, fault.New(fault.Unimplemented, "not implemented by this plane yet"))
}

// writeError answers with refusal e, its status from the one table.
func writeError(w http.ResponseWriter, e *fault.Error) {
	writeJSON(w, e.Code.HTTPStatus(), map[string]string{"error": e.Message, "code": string(e.Code)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return // the client went away; nothing more to send
	}
}
