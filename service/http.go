package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/subjects"
)

// httpDoors builds the HTTP face's doors: the bearer keys (made from the material's first key
// if the space has none), the IdP verifier if the space trusts one, the loopback capability
// (new at every start) and the discovery bundle.
func (p *Plane) httpDoors(d *doors) (*handlers.HTTP, error) {
	cfg := p.cfg
	keys := bearer.New(p.stores.Keys, cfg.Now)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.RequestTimeout)
	defer cancel()
	if err := keys.Ensure(ctx, p.keys.BearerKey); err != nil {
		return nil, fmt.Errorf("bearer keys: %w", err)
	}
	h := &handlers.HTTP{
		Space: cfg.Space, Guard: d.guard, Timeout: cfg.RequestTimeout, Health: p.healthy, Keys: keys,
		OwnerSecret: p.keys.OwnerSecret, Ledger: p.stores.Actors, Manager: d.fns[subjects.EndpointManagerAuthority],
		Cap: subjects.NewSecret(32), TrustedProxy: cfg.TrustedProxy, PeerInFlight: cfg.PublicPeerInFlight, LoopbackInFlight: cfg.LoopbackInFlight,
		BodyTimeout: cfg.HTTPBodyTimeout, PProf: cfg.PProf, Log: p.log.With("face", "http"), Now: cfg.Now,
		Metrics: p.metrics.Handler(), Records: d.records, Unsynced: p.unsyncedServers,
	}
	if cfg.IdP.URL != "" {
		v, err := bearer.NewVerifier(cfg.IdPConfig(), cfg.Now)
		if err != nil {
			return nil, fmt.Errorf("--idp-jwks: %w", err)
		}
		h.IdP = v
	}
	return h, nil
}

// serveLoopback opens the loopback face at the start of Start, serving the starting face:
// `/health` answers 503 with what the start is doing, anything else 503 `unavailable`, until
// serveHTTP hands it the doors.
func (p *Plane) serveLoopback() error {
	var starting http.Handler = http.HandlerFunc(p.starting)
	p.loopback.Store(&starting)
	url, err := p.listen("--http-port", p.cfg.HTTPPort, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(*p.loopback.Load()).ServeHTTP(w, r)
	}))
	if err != nil {
		return err
	}
	p.info.HTTPURL = url
	return nil
}

// starting is the loopback face while the plane starts.
func (p *Plane) starting(w http.ResponseWriter, r *http.Request) {
	refusal := fault.New(fault.Unavailable, "the authority plane is starting; retry shortly")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(refusal.Code.HTTPStatus())
	var body any = map[string]string{"error": refusal.Message, "code": string(refusal.Code)}
	if r.URL.Path == "/health" {
		_, reason := p.healthy(r.Context())
		body = map[string]any{"ok": false, "reason": reason}
	}
	if err := json.NewEncoder(w).Encode(body); err != nil {
		p.log.Debug("starting face: answer not sent", "err", err)
	}
}

// serveHTTP hands the loopback face its doors, and opens the public face when --public-port
// is set.
func (p *Plane) serveHTTP(h *handlers.HTTP) error {
	doors := p.countTransportRefusals("loopback", h.Loopback())
	p.loopback.Store(&doors)
	if p.cfg.PublicPort < 0 {
		return nil
	}
	// The bundle names the configured public URL, not the bound port, unless there is none.
	bound, err := p.listenOn("--public-port", p.cfg.PublicHost, p.cfg.PublicPort)
	if err != nil {
		return err
	}
	public := p.cfg.PublicURL
	if public == "" {
		public = "http://" + bound.Addr().String()
	}
	if h.Bundle, err = p.bundle(public); err != nil {
		return errors.Join(err, bound.Close())
	}
	p.info.PublicURL = public
	p.info.PublicListen = "http://" + bound.Addr().String()
	p.serveOn(bound, p.countTransportRefusals("public", h.Public()), "public")
	return nil
}

// listen opens a face on 127.0.0.1:port and serves handler there; it returns its base URL.
func (p *Plane) listen(flag string, port int, handler http.Handler) (string, error) {
	l, err := p.listenLater(flag, port)
	if err != nil {
		return "", err
	}
	p.serveOn(l, handler, flag)
	return "http://" + l.Addr().String(), nil
}

func (p *Plane) listenLater(flag string, port int) (net.Listener, error) {
	return p.listenOn(flag, "127.0.0.1", port)
}

// listenOn opens a listener on host:port, its refusal naming flag.
func (p *Plane) listenOn(flag, host string, port int) (net.Listener, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("%s %d: %w (pick another port, or 0 for a free one)", flag, port, err)
	}
	return l, nil
}

// serveOn serves handler on l until Close.
func (p *Plane) serveOn(l net.Listener, handler http.Handler, name string) {
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       handlers.PublicDeadline + time.Second,
		WriteTimeout:      15 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	p.bg.Go(func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.finish(fmt.Errorf("http face %s: %w", name, err))
		}
	})
	p.onClose("shut the HTTP face "+name+" down", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); errors.Is(err, context.DeadlineExceeded) {
			// Requests still in flight, or connections opened and never used: cut them.
			p.log.Warn("HTTP face "+name+": connections still open after 5 s; closing them", "face", name)
			return srv.Close()
		} else if err != nil {
			return err
		}
		return nil
	})
}

// bundle is the discovery bundle the public face serves (docs/PROTOCOL.md, "The HTTP face"): where the broker is, the
// IdP the space trusts, the doors, and the deny-all sentinel creds a client connects with.
func (p *Plane) bundle(public string) ([]byte, error) {
	server := p.cfg.AdvertisedServer
	if server == "" {
		server = p.info.NATSURL
	}
	sentinel, err := p.keys.SentinelCreds()
	if err != nil {
		return nil, err
	}
	base := strings.TrimSuffix(public, "/")
	idpc := p.cfg.IdPConfig()
	b := map[string]any{
		"space":       p.cfg.Space,
		"server":      server,
		"tlsRequired": strings.HasPrefix(server, "tls://") || strings.HasPrefix(server, "wss://"),
		"userAuth": map[string]any{
			"provider":  "cotal",
			"idp":       map[string]string{"url": idpc.URL, "issuer": idpc.Issuer, "audience": idpc.Audience},
			"endpoints": map[string]string{"url": base, "managerAuthorityUrl": base + "/manager-service-authority"},
		},
		"sentinelCreds": string(sentinel),
	}
	return json.Marshal(b)
}

// validatePublic checks the public face's flags: each needs --public-port, the host is an IP
// literal, the public URL https (or http on a loopback IP literal: a port published on the
// host's loopback), the advertised server a NATS URL, and the IdP's JWKS https or http on a
// loopback IP literal.
func (c Config) validatePublic(bad func(string, ...any)) {
	if c.PublicPort < -1 || c.PublicPort > 65535 {
		bad("--public-port %d: want 0 to 65535, or -1 for no public face", c.PublicPort)
	}
	if ip := net.ParseIP(c.PublicHost); ip == nil {
		bad("--public-host %q: want an IP address (127.0.0.1, or 0.0.0.0 in a container whose port is published)", c.PublicHost)
	} else if ip.IsUnspecified() && c.PublicURL == "" && c.PublicPort >= 0 {
		bad("--public-host %s: needs --public-url, the address clients reach the face at (the bundle names it)", c.PublicHost)
	}
	off := c.PublicPort < 0
	if c.PublicURL != "" {
		u, err := url.Parse(c.PublicURL)
		loopback := err == nil && u.Scheme == "http" && net.ParseIP(u.Hostname()) != nil && net.ParseIP(u.Hostname()).IsLoopback()
		if err != nil || (u.Scheme != "https" && !loopback) || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			bad("--public-url %q: want https://host[/path] (TLS ends at the proxy in front of the public face), or http:// on a loopback IP literal", c.PublicURL)
		}
		if off {
			bad("--public-url: needs --public-port")
		}
	}
	if c.TrustedProxy && off {
		bad("--trusted-proxy: needs --public-port")
	}
	if c.AdvertisedServer != "" {
		u, err := url.Parse(c.AdvertisedServer)
		if err != nil || u.Host == "" || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, u.Scheme) {
			bad("--advertised-server %q: want nats://, tls://, ws:// or wss:// host:port", c.AdvertisedServer)
		}
		if off {
			bad("--advertised-server: needs --public-port")
		}
	}
	if c.IdP.URL == "" {
		if c.IdP.Issuer != "" || c.IdP.Audience != "" || c.IdP.JWKS != "" {
			bad("--idp-issuer, --idp-audience and --idp-jwks: need --idp-url")
		}
		return
	}
	if u, err := url.Parse(c.IdP.URL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		bad("--idp-url %q: want the identity provider's https:// URL", c.IdP.URL)
		return
	}
	if err := bearer.CheckJWKSURL(c.IdPConfig().JWKS); err != nil {
		bad("--idp-jwks: %v", err)
	}
}

// validateHTTPBudgets checks the HTTP faces' budgets: a peer's share of the public face's
// slots, the loopback doors' slots, and the wait for a body.
func (c Config) validateHTTPBudgets(bad func(string, ...any)) {
	if c.PublicPeerInFlight < 1 || c.PublicPeerInFlight > handlers.PublicMaxInFlight {
		bad("--public-peer-inflight %d: want 1 to %d (the public face's requests in flight)", c.PublicPeerInFlight, handlers.PublicMaxInFlight)
	}
	if c.LoopbackInFlight < 1 || c.LoopbackInFlight > 4096 {
		bad("--loopback-inflight %d: want 1 to 4096", c.LoopbackInFlight)
	}
	if c.HTTPBodyTimeout < 100*time.Millisecond || c.HTTPBodyTimeout > handlers.PublicDeadline {
		bad("--http-body-timeout %s: want 100ms to %s", c.HTTPBodyTimeout, handlers.PublicDeadline)
	}
}
