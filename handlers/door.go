package handlers

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/platform/metrics"
)

// contentJSON is what a door's Content-Type must start with.
var contentJSON = regexp.MustCompile(`^application/json\b`)

// doorFunc serves a door's body: a reply, or a refusal.
type doorFunc func(ctx context.Context, peer string, data []byte) (any, *fault.Error)

// door wraps a POST door in the face's guards, in order: 405 not POST, 403 any Origin, 415 not
// JSON, (loopback) 401 a missing or wrong capability and 429 past 30 of those a minute, 503
// past the loopback doors' slots, then the body: 503 not in within BodyTimeout, 413 over
// maxBody, 400 not JSON. A refusal past them counts against the peer's budget; once the budget
// is spent a refusal is 429 and withholds its reason, while a valid credential still succeeds.
func (f *face) door(serve doorFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method != http.MethodPost:
			closeUnread(w)
			writeError(w, fault.New(fault.MethodNotAllowed, "POST only"))
			return
		case r.Header.Values("Origin") != nil:
			closeUnread(w)
			writeError(w, fault.New(fault.PermissionDenied, "browser-origin requests are not served here"))
			return
		case !contentJSON.MatchString(r.Header.Get("Content-Type")):
			closeUnread(w)
			writeError(w, fault.New(fault.UnsupportedMediaType, "content-type must be application/json"))
			return
		}
		now := f.h.Now()
		if !f.public && !f.capOK(r) {
			closeUnread(w)
			f.badCaps.record("loopback", now)
			if f.badCaps.count("loopback", now) > refusalsPerMinute {
				writeError(w, fault.New(fault.ResourceExhausted, "too many invalid-capability attempts - wait a minute and retry"))
				return
			}
			writeError(w, fault.New(fault.Unauthenticated, "missing/invalid exchange capability - read it from the space's auth-service.json"))
			return
		}
		if !f.public {
			// Every loopback peer is 127.0.0.1, and every door there needs the one capability:
			// its holders share one budget of the face's door slots.
			if !f.peers.take(loopbackHolder) {
				f.h.Guard.Metrics.HTTPRefused(f.name, metrics.BudgetInFlight)
				closeUnread(w)
				writeError(w, errBusy)
				return
			}
			defer f.peers.give(loopbackHolder)
		}
		peer := f.peer(r)
		throttled := f.refusals.count(peer, now) >= refusalsPerMinute
		data, ferr := f.readBody(w, r)
		if ferr != nil {
			closeUnread(w)
			writeError(w, ferr)
			return
		}
		reply, refusal := serve(r.Context(), peer, data)
		if refusal == nil {
			writeJSON(w, http.StatusOK, reply)
			return
		}
		f.refusals.record(peer, now)
		if throttled {
			refusal = fault.New(fault.ResourceExhausted, "too many refused requests - wait a minute and retry")
		}
		writeError(w, refusal)
	}
}

// closeUnread marks an answer given before the request's body was read: the connection closes
// after it, where the server would otherwise read the rest of the body, as slowly as the client
// sends it, before answering.
func closeUnread(w http.ResponseWriter) { w.Header().Set("Connection", "close") }

// capOK checks the loopback capability in constant time.
func (f *face) capOK(r *http.Request) bool {
	got := r.Header.Get("Authorization")
	return f.h.Cap != "" && subtle.ConstantTimeCompare([]byte(got), []byte("Bearer "+f.h.Cap)) == 1
}

// peer names whom a request's budgets are charged to: the socket's address, or on the public
// face behind a trusted proxy the last X-Forwarded-For hop (peerOf).
func (f *face) peer(r *http.Request) string {
	if !f.public {
		return "loopback"
	}
	if f.h.TrustedProxy {
		if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
			hops := strings.Split(xff[len(xff)-1], ",")
			if hop := strings.TrimSpace(hops[len(hops)-1]); hop != "" {
				return peerOf(hop)
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return peerOf(r.RemoteAddr)
	}
	return peerOf(host)
}

// peerOf is the peer an address is charged to: an IPv4 address, or an IPv6 address's /64 (one
// host is routinely given a whole /64, and would otherwise be as many peers as it likes),
// without a port (a proxy that adds the client's would make each connection a peer). What is
// not an IP address is its own peer.
func peerOf(addr string) string {
	ip, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]"))
	if ap, perr := netip.ParseAddrPort(addr); err != nil && perr == nil {
		ip, err = ap.Addr(), nil
	}
	if err != nil {
		return addr
	}
	ip = ip.Unmap()
	if ip.Is4() {
		return ip.String()
	}
	prefix, err := ip.WithZone("").Prefix(64)
	if err != nil {
		return addr
	}
	return prefix.String()
}

// errBusy answers a request past a face's cap on requests in flight.
var errBusy = fault.New(fault.Unavailable, "busy - retry shortly")

// loopbackHolder is the key of the loopback doors' slots: the capability's holders, together.
const loopbackHolder = "capability"

// readBody reads a door's body: at most maxBody bytes (413 past it), within BodyTimeout of the
// headers and before the request's deadline (503 past either), and JSON (400 otherwise). A
// body read, the connection's read deadline is the request's again (none on loopback): the
// server's read after the body would otherwise hit the body's deadline and cancel the request
// while its door still works.
func (f *face) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *fault.Error) {
	rc := http.NewResponseController(w)
	wait := orDefault(f.h.BodyTimeout, DefaultBodyTimeout)
	by := time.Now().Add(wait)
	deadline, bounded := r.Context().Deadline()
	requestFirst := bounded && !by.Before(deadline)
	if requestFirst {
		by = deadline
	}
	if err := rc.SetReadDeadline(by); err != nil {
		f.h.Log.Debug("no body deadline on a request", "err", err)
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if rerr := rc.SetReadDeadline(deadline); rerr != nil {
		f.h.Log.Debug("read deadline not restored after a body", "err", rerr)
	}
	switch {
	case err != nil && (errors.Is(err, context.DeadlineExceeded) || isTimeout(err)) && requestFirst:
		return nil, fault.New(fault.Unavailable, "request deadline exceeded")
	case err != nil && (errors.Is(err, context.DeadlineExceeded) || isTimeout(err)):
		f.h.Guard.Metrics.HTTPRefused(f.name, metrics.BudgetBodyTimeout)
		return nil, fault.New(fault.Unavailable, "request body not received within %s of its headers", wait)
	case err != nil:
		return nil, fault.New(fault.BadRequest, "request body could not be read")
	case len(data) > maxBody:
		return nil, fault.New(fault.TooLarge, "request body too large (maximum %d bytes)", maxBody)
	case !json.Valid(data):
		return nil, fault.New(fault.BadRequest, "request body is not valid JSON")
	}
	return data, nil
}

// orDefault is n, or def when n is not set.
func orDefault[T int | time.Duration](n, def T) T {
	if n <= 0 {
		return def
	}
	return n
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// writeError answers with refusal e, its status from fault's one table: `{error, code}`.
func writeError(w http.ResponseWriter, e *fault.Error) {
	writeJSON(w, e.Code.HTTPStatus(), map[string]string{"error": e.Message, "code": string(e.Code)})
}

// writeJSON answers with v as JSON (no HTML escaping), never cached. No CORS header, ever.
func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := fault.Encode(v)
	if err != nil {
		status, data = http.StatusInternalServerError, []byte(`{"error":"internal error","code":"internal"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	if w.Header().Get("Cache-Control") == "" {
		w.Header().Set("Cache-Control", "no-store")
	}
	w.WriteHeader(status)
	if _, err := w.Write(append(data, '\n')); err != nil {
		return // the client went away; nothing more to send
	}
}
