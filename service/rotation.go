package service

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// RotationTick is how often the plane resumes a rotation of the data account's signing keys
// under way (one a crashed command or replica left, or a scheduled one whose old keys may now
// leave), and begins a scheduled one when --rotate-signing-every says it is due.
const RotationTick = 10 * time.Second

// rotationTimeout bounds one tick's work: an emergency rotation waits for the broker to list
// no connection of the old keys.
const rotationTimeout = 30 * time.Second

// planeRotation is the plane's side of the rotation of the data account's signing keys: the
// rotation, and the serving user's generation, renewed when another one signs.
type planeRotation struct {
	rotation *signers.Rotation
	// renewServing replaces the serving user (serveBus); gen is the generation that signed the
	// serving user last.
	renewServing atomic.Pointer[func() error]
	gen          atomic.Uint64
}

// newRotation builds the rotation of the data account's signing keys on the signer set: its
// generations past 0 are read from the keys bucket, every mint reads which one signs, and the
// engine which one keys the proofs. Without the operator signing key there is none.
func (p *Plane) newRotation() {
	p.signers.Keys.Stored(p.stores.Keys)
	if p.signers.Sign == nil {
		return
	}
	cfg := p.cfg
	p.rot.rotation = &signers.Rotation{Set: p.signers, Now: cfg.Now,
		// The longest life of a credential one generation signs: a standing duty's, the
		// plane's own users', a bearer's callout user's.
		Longest: max(cfg.StandingTTL, cfg.PlaneUserTTL, bearer.MaxTTL+bearer.Skew),
		// A mint that read the old generation signs within its deadline; the replicas'
		// clocks may differ.
		Slack:   cfg.RequestTimeout + clockSkew,
		Bearers: bearer.New(p.stores.Keys, cfg.Now),
		Servers: p.dataAccount,
	}
	if cfg.Hooks != nil {
		p.rot.rotation.StopAfter = cfg.Hooks.RotationStopAfter
	}
	p.signers.State = p.rot.rotation.State
}

// trust is what keys the registration proofs: the rotation's trust root, or, without a
// rotation, generation 0's.
func (p *Plane) trust() manager.Trust {
	if p.rot.rotation == nil {
		return nil
	}
	return p.rot.rotation
}

// servingAuth authenticates the serving connection as a fresh data-account user, signed at
// every (re)connect by the generation of signing keys that signs then: an emergency rotation
// closes the connection, and it comes back under the new keys.
func (p *Plane) servingAuth(data *issue.Issuer) (nats.Option, error) {
	name, perms := p.userName("serving"), subjects.ServingPermissions(p.cfg.Space)
	if p.rot.rotation == nil {
		return data.Connect(name, perms, p.cfg.PlaneUserTTL)
	}
	return issue.ConnectVia(func() (*issue.Issuer, error) {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.RequestTimeout)
		defer cancel()
		st, err := p.rot.rotation.State(ctx)
		if err != nil {
			return nil, err
		}
		iss, err := p.signers.Main(ctx)
		if err == nil {
			p.rot.gen.Store(st.Current)
		}
		return iss, err
	}, name, perms, p.cfg.PlaneUserTTL)
}

// rotateOnTick resumes a rotation under way every RotationTick, and begins a scheduled one
// when --rotate-signing-every says it is due, until the plane closes. A rotation that two
// replicas resume at once is made once: each step is a CAS on the rotation's row.
func (p *Plane) rotateOnTick() {
	if p.rot.rotation == nil {
		return
	}
	every := RotationTick
	if p.cfg.Hooks != nil && p.cfg.Hooks.RotationTick > 0 {
		every = p.cfg.Hooks.RotationTick
	}
	p.untilClose("stop rotating the signing keys", func(ctx context.Context) {
		onEveryTick(ctx, every, true, func() {
			rctx, cancel := context.WithTimeout(ctx, rotationTimeout)
			defer cancel()
			rep, err := p.rot.rotation.Resume(rctx)
			p.renewServingIfRotated(rctx)
			if err == nil && rep.OpID == "" && p.cfg.RotateSigningEvery > 0 {
				if rep, err = p.rot.rotation.Due(rctx, p.cfg.RotateSigningEvery); rep != nil && err == nil {
					p.log.Info("began a scheduled rotation of the signing keys", "op", rep.OpID, "generation", rep.To, "step", rep.Step)
				}
			}
			switch {
			case ctx.Err() != nil:
			case err != nil:
				p.log.Warn("the rotation of the signing keys did not go on; resumed in "+every.String(), "err", err)
			case rep != nil && rep.Done && rep.OpID != "":
				p.log.Info("rotated the signing keys", "op", rep.OpID, "kind", rep.Kind, "generation", rep.To)
			}
		})
	})
}

// renewServingIfRotated replaces the serving user when a generation other than the one that
// signed it signs now: after a scheduled rotation's switch, the old keys sign nothing of this
// replica's long before they leave.
func (p *Plane) renewServingIfRotated(ctx context.Context) {
	st, err := p.rot.rotation.State(ctx)
	renew := p.rot.renewServing.Load()
	if err != nil || st.Current == p.rot.gen.Load() || renew == nil {
		return
	}
	if err := (*renew)(); err != nil {
		p.log.Warn("renewing the serving user under the signing keys that sign now failed; retried at the next tick", "err", err)
	}
}
