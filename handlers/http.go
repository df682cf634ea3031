package handlers

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/platform/metrics"
)

// Bounds of the HTTP face (docs/PROTOCOL.md, "The HTTP face").
const (
	// maxBody is the largest body a door reads: exactly this many bytes are judged on their
	// content, one more is 413.
	maxBody = 65536
	// PublicMaxInFlight bounds the public face's requests in flight, every peer's together;
	// past it, 503.
	PublicMaxInFlight = 64
	// DefaultPeerInFlight bounds one peer's requests in flight on the public face (HTTP.PeerInFlight
	// unless set); past it, 429.
	DefaultPeerInFlight = 8
	// DefaultLoopbackInFlight bounds the loopback face's door requests in flight (HTTP.LoopbackInFlight
	// unless set); past it, 503.
	DefaultLoopbackInFlight = 64
	// DefaultBodyTimeout is how long a door waits for a body once it has the request's headers
	// (HTTP.BodyTimeout unless set); past it, 503.
	DefaultBodyTimeout = 2 * time.Second
	// PublicDeadline bounds a public request, its body included; past it, 503.
	PublicDeadline = 10 * time.Second
	// refusalsPerMinute is a peer's refusal budget: past it, a refusal is 429 without its reason.
	refusalsPerMinute = 30
	// peerBuckets bounds the per-peer budgets kept.
	peerBuckets = 1024
)

// HTTP is the plane's HTTP face: a loopback listener, always, and a public one, optional. Each
// is a closed route table matched on the exact path; every POST door passes the face's guards
// (method, origin, content type, the loopback capability, size, JSON) and then the one guard
// every call passes, and mints through the same pipeline as the bus.
type HTTP struct {
	Space   string
	Guard   *Guard
	Timeout time.Duration
	// Health says whether the plane can serve, and if not, why.
	Health func(ctx context.Context) (ok bool, reason string)
	// Unsynced names the servers not syncing every write that --allow-unsynced accepted, for an
	// ok /health to list. Nil: none.
	Unsynced func() []string
	Keys     *bearer.Keys
	// Records records every bearer issued.
	Records Exchanges
	// IdP verifies the identity provider's tokens; nil when the space trusts none.
	IdP         *bearer.Verifier
	OwnerSecret []byte
	Ledger      fence.KV
	// Manager serves a manager-authority request, as on the bus.
	Manager Func
	// Cap is the loopback capability (`Authorization: Bearer <cap>`, from auth-service.json).
	Cap string
	// Bundle is the discovery bundle the public face serves.
	Bundle []byte
	// Metrics serves the Prometheus metrics on the loopback face; nil serves none.
	Metrics http.Handler
	// TrustedProxy says the public face sits behind a proxy whose X-Forwarded-For's last hop
	// names the peer.
	TrustedProxy bool
	// PeerInFlight bounds one public peer's requests in flight (DefaultPeerInFlight when 0), so
	// one peer cannot hold every one of the face's PublicMaxInFlight slots.
	PeerInFlight int
	// LoopbackInFlight bounds the loopback face's door requests in flight, every holder of the
	// capability's together (DefaultLoopbackInFlight when 0).
	LoopbackInFlight int
	// BodyTimeout is how long a door waits for a body after the request's headers, on either
	// face (DefaultBodyTimeout when 0).
	BodyTimeout time.Duration
	// PProf adds net/http/pprof's routes to the loopback face (never the public one).
	PProf bool
	Log   *slog.Logger
	Now   func() time.Time
}

// Exchanges records the bearers /exchange issues (audit.Writer).
type Exchanges interface {
	Exchanged(ctx context.Context, req audit.Request, b audit.Bearer)
}

// face is one listener's state: its routes and budgets.
type face struct {
	h      *HTTP
	name   string // "loopback" or "public", its metrics' label
	public bool
	routes map[string]http.HandlerFunc
	// queried are the routes that take a query (pprof's); every other refuses one.
	queried  map[string]bool
	known    string
	refusals *windows
	badCaps  *windows
	inFlight atomic.Int64
	// peers holds each public peer's requests in flight, and the loopback doors' under one key.
	peers *slots
}

// Loopback returns the loopback face's handler: health, jwks, and the exchange and
// manager-service-authority doors behind the capability.
func (h *HTTP) Loopback() http.Handler {
	f := &face{h: h, name: "loopback", refusals: newWindows(), badCaps: newWindows(), peers: newSlots(orDefault(h.LoopbackInFlight, DefaultLoopbackInFlight))}
	f.routes = map[string]http.HandlerFunc{
		"/health":                    f.health,
		"/jwks":                      f.jwks,
		"/exchange":                  f.door(f.exchange),
		"/manager-service-authority": f.door(f.managerAuthority),
	}
	f.known = "/health, /jwks, /exchange, /manager-service-authority"
	if h.Metrics != nil {
		f.routes["/metrics"] = f.metrics
		f.known += ", /metrics"
	}
	if h.PProf {
		f.addPProf()
	}
	return f
}

// addPProf adds net/http/pprof's routes, each on its exact path and taking its query
// (`?seconds=`, `?debug=`): the index, its named profiles, and the CPU profile, trace, command
// line and symbol lookup.
func (f *face) addPProf() {
	const prefix = "/debug/pprof/"
	f.queried = map[string]bool{}
	add := func(path string, h http.HandlerFunc) {
		f.routes[path], f.queried[path] = h, true
	}
	add(prefix, pprof.Index)
	add(prefix+"cmdline", pprof.Cmdline)
	add(prefix+"profile", pprof.Profile)
	add(prefix+"symbol", pprof.Symbol)
	add(prefix+"trace", pprof.Trace)
	for _, name := range []string{"allocs", "block", "goroutine", "heap", "mutex", "threadcreate"} {
		add(prefix+name, pprof.Handler(name).ServeHTTP)
	}
	f.known += ", " + prefix + "…"
}

// Public returns the public face's handler: the loopback routes with no capability (the IdP
// token or the agent's secret is the proof), and the discovery bundle; at most
// PublicMaxInFlight requests at once, at most PeerInFlight of them from one peer, each within
// PublicDeadline.
func (h *HTTP) Public() http.Handler {
	f := &face{h: h, name: "public", public: true, refusals: newWindows(), peers: newSlots(orDefault(h.PeerInFlight, DefaultPeerInFlight))}
	f.routes = map[string]http.HandlerFunc{
		"/health":                    f.health,
		"/jwks":                      f.jwks,
		"/exchange":                  f.door(f.exchange),
		"/manager-service-authority": f.door(f.managerAuthority),
		"/.well-known/cotal-mesh":    f.bundle,
	}
	f.known = "/health, /jwks, /exchange, /manager-service-authority, /.well-known/cotal-mesh"
	return f
}

// ServeHTTP routes on the exact raw path: no cleaning, no trailing-slash redirects, no queries.
func (f *face) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.public {
		if f.inFlight.Add(1) > PublicMaxInFlight {
			f.inFlight.Add(-1)
			f.h.Guard.Metrics.HTTPRefused(f.name, metrics.BudgetInFlight)
			closeUnread(w)
			writeError(w, errBusy)
			return
		}
		defer f.inFlight.Add(-1)
		// The face's slots are shared by every peer; one peer holds at most its own share. The
		// global cap above bounds how many peers are held here at once.
		peer := f.peer(r)
		if !f.peers.take(peer) {
			f.h.Guard.Metrics.HTTPRefused(f.name, metrics.BudgetPeerInFlight)
			closeUnread(w)
			writeError(w, fault.New(fault.ResourceExhausted, "too many requests in flight from one peer (at most %d) - finish one and retry", f.peers.max))
			return
		}
		defer f.peers.give(peer)
		ctx, cancel := context.WithTimeout(r.Context(), PublicDeadline)
		defer cancel()
		r = r.WithContext(ctx)
		if err := http.NewResponseController(w).SetReadDeadline(time.Now().Add(PublicDeadline)); err != nil {
			f.h.Log.Debug("no read deadline on a public request", "err", err)
		}
	}
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	route, ok := f.routes[path]
	if !ok || (r.URL.RawQuery != "" || r.URL.ForceQuery) && !f.queried[path] {
		closeUnread(w)
		writeError(w, fault.New(fault.NotFound, "unknown path - %s", f.known))
		return
	}
	route(w, r)
}

func (f *face) health(w http.ResponseWriter, r *http.Request) {
	if !getOnly(w, r) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if ok, reason := f.h.Health(ctx); !ok {
		writeJSON(w, fault.Unavailable.HTTPStatus(), map[string]any{"ok": false, "reason": reason})
		return
	}
	answer := map[string]any{"ok": true, "issuer": "urn:cotal:auth:" + f.h.Space}
	if u := f.h.Unsynced; u != nil && len(u()) > 0 {
		answer["unsynced"] = u()
	}
	writeJSON(w, http.StatusOK, answer)
}

func (f *face) jwks(w http.ResponseWriter, r *http.Request) {
	if !getOnly(w, r) {
		return
	}
	doc, etag, err := f.h.Keys.JWKS(r.Context())
	if err != nil {
		f.h.Log.Warn("jwks not served", "err", err)
		writeError(w, fault.Store(err, "reading the bearer keys"))
		return
	}
	w.Header().Set("Cache-Control", "max-age=300")
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(doc); err != nil {
		f.h.Log.Debug("jwks not sent", "err", err)
	}
}

func (f *face) metrics(w http.ResponseWriter, r *http.Request) {
	if !getOnly(w, r) {
		return
	}
	f.h.Metrics.ServeHTTP(w, r)
}

func (f *face) bundle(w http.ResponseWriter, r *http.Request) {
	if !getOnly(w, r) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(f.h.Bundle); err != nil {
		f.h.Log.Debug("bundle not sent", "err", err)
	}
}

// getOnly answers 405 to anything but GET and HEAD.
func getOnly(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(w, fault.New(fault.MethodNotAllowed, "GET only"))
		return false
	}
	return true
}
