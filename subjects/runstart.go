package subjects

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
)

// Run-start routes: `one` (queue: one manager of the owner), `all` (every manager of the
// owner), `inst` (one named instance).
const (
	RouteOne  = "one"
	RouteAll  = "all"
	RouteInst = "inst"
)

var (
	generationRe = regexp.MustCompile(`^[1-9][0-9]{0,18}$`)
	nonceRe      = regexp.MustCompile(`^[A-Za-z0-9_-]{16,64}$`)
)

// RunStart is a parsed run-start subject: the route, the instance it names (inst only), and
// the caller that published it (docs/PROTOCOL.md, "Subjects and callers"): its owner and actor, which the broker forge-locks,
// its lifecycle uid, issued generation and a nonce.
type RunStart struct {
	Space      string
	Route      string
	Instance   string
	Owner      string
	Actor      string
	UID        string
	Generation string
	Nonce      string
}

// Subject is the run-start's subject.
func (r RunStart) Subject() string {
	head := "cotal." + r.Space + ".ep.v1." + r.Route + ".manager."
	if r.Route == RouteInst {
		head += r.Instance + "."
	}
	return head + "run-start." + strings.Join([]string{r.Owner, r.Actor, r.UID, r.Generation, r.Nonce}, ".")
}

// ParseRunStart parses a run-start subject of space: `cotal.<space>.ep.v1.<one|all>.manager.
// run-start.<o>.<a>.<uid>.<gen>.<nonce>` or `cotal.<space>.ep.v1.inst.manager.<iid>.run-start.
// <o>.<a>.<uid>.<gen>.<nonce>`, every token on its grammar. ok is false otherwise.
func ParseRunStart(space, subject string) (RunStart, bool) {
	rest, found := strings.CutPrefix(subject, "cotal."+space+".ep.v1.")
	if !found {
		return RunStart{}, false
	}
	t := strings.Split(rest, ".")
	r := RunStart{Space: space}
	switch {
	case len(t) == 8 && (t[0] == RouteOne || t[0] == RouteAll) && t[1] == "manager" && t[2] == "run-start":
		r.Route, t = t[0], t[3:]
	case len(t) == 9 && t[0] == RouteInst && t[1] == "manager" && ValidUID(t[2]) && t[3] == "run-start":
		r.Route, r.Instance, t = t[0], t[2], t[4:]
	default:
		return RunStart{}, false
	}
	r.Owner, r.Actor, r.UID, r.Generation, r.Nonce = t[0], t[1], t[2], t[3], t[4]
	if !ValidOwner(r.Owner) || !ValidActor(r.Actor) || !ValidUID(r.UID) || !generationRe.MatchString(r.Generation) || !nonceRe.MatchString(r.Nonce) {
		return RunStart{}, false
	}
	return r, true
}

// WitnessMarkerKey is the key, in AdmissionBucket, of the create-only marker that consumes the
// witness of a run-start subject: every replica agrees it is admitted once.
func WitnessMarkerKey(subject string) string {
	sum := sha256.Sum256([]byte(subject))
	return "witness.v1." + hex.EncodeToString(sum[:16])
}
