// Package httpface is the plane's small HTTP face: closed route tables matched on the exact
// path, JSON everywhere, no CORS headers ever.
package httpface

import (
	"encoding/json"
	"net/http"
)

// Loopback returns the handler of the loopback listener (always on, 127.0.0.1).
func Loopback(issuer string) http.Handler {
	routes := map[string]http.HandlerFunc{
		"/health":                    health(issuer),
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
			writeError(w, http.StatusNotFound, "not-found", "unknown path - /health, /jwks, /exchange, /manager-service-authority")
			return
		}
		h(w, r)
	})
}

func health(issuer string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeError(w, http.StatusMethodNotAllowed, "bad-request", "GET only")
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "issuer": issuer})
	}
}

func unimplemented(w http.ResponseWriter, _ *http.Request) {
	writeError(w, http.StatusNotImplemented, "unimplemented", "not implemented by this plane yet")
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]string{"error": message, "code": code})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return // the client went away; nothing more to send
	}
}
