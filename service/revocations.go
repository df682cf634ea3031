package service

import (
	"context"
	"time"
)

// RevocationRecheckEvery is how often the plane checks that every server of the broker revokes
// every key on the data account's revocation set, and signs and pushes the set again when one
// does not: a push of an older account JWT (by anything else that pushes the data account, or
// one of a replica's that reached a server late) undoes revocations at a server until the next
// recheck after the set's last signing is revocation.RecheckGrace old (or, while something
// keeps pushing one, until it stops).
const RevocationRecheckEvery = 30 * time.Second

// recheckRevocations runs the revocation set's Recheck every RevocationRecheckEvery until the
// plane closes.
func (p *Plane) recheckRevocations() {
	every := RevocationRecheckEvery
	if p.cfg.Hooks != nil && p.cfg.Hooks.RevocationRecheckEvery > 0 {
		every = p.cfg.Hooks.RevocationRecheckEvery
	}
	p.untilClose("stop rechecking the broker's revocations", func(ctx context.Context) {
		onEveryTick(ctx, every, false, func() {
			// A recheck that signs again waits for a round (the next second, a push, the
			// set read back from every server): it gets at least the time of a request.
			rctx, cancel := context.WithTimeout(ctx, max(every, p.cfg.RequestTimeout))
			reapplied, err := p.revocations.Recheck(rctx)
			cancel()
			switch {
			case ctx.Err() != nil:
			case reapplied && err != nil:
				p.log.Warn("a server of the broker did not revoke every key of the revocation set (an older account JWT was pushed); signed and pushed the set again, but the broker did not confirm it; checked again in "+every.String(), "err", err)
			case reapplied:
				p.log.Warn("a server of the broker did not revoke every key of the revocation set (an older account JWT was pushed); signed and pushed the set again")
			case err != nil:
				p.log.Warn("the broker's revocations were not checked against the revocation set; checked again in "+every.String(), "err", err)
			}
		})
	})
}
