package subjects

import (
	"crypto/sha256"
	"encoding/base32"
	"slices"
	"strings"
)

// Service identity of the plane on the bus.
const (
	// ServiceName is the micro service name (`nats micro info cotal-auth`).
	ServiceName = "cotal-auth"
	// QueueGroup is the queue group every replica's endpoints join.
	QueueGroup = "cotal-auth"
	// Protocol is the value of the `protocol` metadata key.
	Protocol = "cotal-auth/1"
)

// The five endpoints of the plane, in the order docs/PROTOCOL.md lists them.
const (
	EndpointManagerAuthority    = "manager-authority"
	EndpointRunRevoke           = "run-revoke"
	EndpointSupervisorAssign    = "supervisor-assign"
	EndpointSupervisorAuthority = "supervisor-authority"
	EndpointSupervisorEnd       = "supervisor-end"
)

// Endpoints lists every endpoint name.
var Endpoints = []string{
	EndpointManagerAuthority,
	EndpointRunRevoke,
	EndpointSupervisorAssign,
	EndpointSupervisorAuthority,
	EndpointSupervisorEnd,
}

// Issuer is the plane's issuer name for a space (`urn:cotal:auth:<space>`).
func Issuer(space string) string { return "urn:cotal:auth:" + space }

// DataAccountName is the name of the data account of a space.
func DataAccountName(space string) string { return "cotal_" + space }

// AuthPrefix is the micro group prefix of the plane's endpoints: `cotal.<space>.auth`.
func AuthPrefix(space string) string { return "cotal." + space + ".auth" }

// EndpointPattern is the subject an endpoint is served on, relative to AuthPrefix: the caller's
// principal fills the two wildcards.
func EndpointPattern(endpoint string) string { return endpoint + ".*.*" }

// EndpointSubject is the subject principal owner.actor publishes a request for endpoint on.
func EndpointSubject(space, endpoint, owner, actor string) string {
	return AuthPrefix(space) + "." + endpoint + "." + owner + "." + actor
}

// callerSubjects is the publish grant that forge-locks a principal to its own plane subjects.
func callerSubjects(space, owner, actor string) string {
	return AuthPrefix(space) + ".*." + owner + "." + actor
}

// ParseEndpointSubject returns the endpoint and caller principal of a request subject, and false
// when the subject is not `cotal.<space>.auth.<endpoint>.<owner>.<actor>` with valid tokens.
func ParseEndpointSubject(space, subject string) (endpoint, owner, actor string, ok bool) {
	rest, found := strings.CutPrefix(subject, AuthPrefix(space)+".")
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || parts[0] == "" || !ValidOwner(parts[1]) || !ValidActor(parts[2]) {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// Principal is the dotted form `<owner>.<actor>`: the JWT name and the audit's caller.
func Principal(owner, actor string) string { return owner + "." + actor }

// SplitPrincipal splits `<owner>.<actor>`; ok is false unless both tokens are valid.
func SplitPrincipal(p string) (owner, actor string, ok bool) {
	owner, actor, found := strings.Cut(p, ".")
	if !found || !ValidOwner(owner) || !ValidActor(actor) {
		return "", "", false
	}
	return owner, actor, true
}

// InboxPrefix is the only inbox prefix a principal may receive replies on:
// `_INBOX.<owner>.<actor>` (pass it to `nats --inbox-prefix` or nats.CustomInboxPrefix).
func InboxPrefix(owner, actor string) string { return "_INBOX." + owner + "." + actor }

// ReplyAllowed reports whether reply lies under the caller's own inbox prefix, the only place
// the plane answers a request: one or more tokens after it, none empty, no wildcard, no space.
func ReplyAllowed(reply, owner, actor string) bool {
	rest, ok := strings.CutPrefix(reply, InboxPrefix(owner, actor)+".")
	if !ok || strings.ContainsAny(rest, "*> \t\r\n") {
		return false
	}
	for tok := range strings.SplitSeq(rest, ".") {
		if tok == "" {
			return false
		}
	}
	return true
}

// Manager actors of one instance.

// SupervisorActor is the actor of an instance's supervisor duty.
func SupervisorActor(iid string) string { return "manager_" + iid }

// ExecutorActor is the actor of an instance's executor duty.
func ExecutorActor(iid string) string { return "manager_exec_" + iid }

// ServeActor is the actor of an instance's serve duty, and the gate's principal actor.
func ServeActor(iid string) string { return "manager_serve_" + iid }

// GoalWriterActor is the actor of an instance's goal-writer duty.
func GoalWriterActor(iid string) string { return "manager_goal_" + iid }

// SessionLedgerActor is the actor of an instance's session-ledger duty.
func SessionLedgerActor(iid string) string { return "manager_session_" + iid }

// RunActor is the actor of a run's driver and mediator: `wf_<runId hex>`.
func RunActor(runID string) string { return "wf_" + strings.TrimPrefix(runID, "run-") }

// Run-start subjects: what callers publish, serve duties answer and the witness captures.

// RunStartExports lists the run-start subjects the data account exports to the plane account.
func RunStartExports(space string) []string {
	p := "cotal." + space + ".ep.v1."
	return []string{
		p + "one.manager.run-start.>",
		p + "all.manager.run-start.>",
		p + "inst.manager.*.run-start.>",
	}
}

// OwnerRunStarts lists the run-start subjects owner's callers publish: what the owner's witness
// stream captures. No two owners' overlap.
func OwnerRunStarts(space, owner string) []string {
	p := "cotal." + space + ".ep.v1."
	return []string{
		p + "one.manager.run-start." + owner + ".>",
		p + "all.manager.run-start." + owner + ".>",
		p + "inst.manager.*.run-start." + owner + ".>",
	}
}

// Records the plane writes into its own account.

// NoInstance stands for the instance in the `minted` subject of a credential minted for no
// instance (a connection the auth callout made); no instance id is "_".
const NoInstance = "_"

// MintedSubject is the subject of the `minted` record of one mint of an instance (iid "" for
// none) that signed keys: `cotal.<space>.minted.<iid>.<MintedDigest(keys)>`. A mint of the same
// keys again replaces the record (the stream keeps one message a subject); a mint of any other
// set has a subject of its own, so no record of a key still live is overwritten by one that
// does not name it.
func MintedSubject(space, iid string, keys []string) string {
	if iid == "" {
		iid = NoInstance
	}
	return "cotal." + space + ".minted." + iid + "." + MintedDigest(keys)
}

// MintedDigestLen is the length of a MintedDigest.
const MintedDigestLen = 26

// MintedDigest names a set of keys in one subject token: SHA-256 over the keys, sorted, each
// once, joined by ",", in lower-case base32, cut to its first MintedDigestLen characters (130
// bits): `printf %s "$A,$B" | sha256sum | xxd -r -p | base32 | tr A-Z a-z | cut -c1-26`.
func MintedDigest(keys []string) string {
	set := slices.Compact(slices.Sorted(slices.Values(keys)))
	sum := sha256.Sum256([]byte(strings.Join(set, ",")))
	return strings.ToLower(base32.StdEncoding.EncodeToString(sum[:]))[:MintedDigestLen]
}

// MintedInstanceFilter matches every `minted` record of an instance.
func MintedInstanceFilter(space, iid string) string {
	return "cotal." + space + ".minted." + iid + ".>"
}

// MintedStreamSubjects is the subject space of the minted stream.
func MintedStreamSubjects(space string) string { return "cotal." + space + ".minted.>" }

// AuditSubject is the subject of an audit record: `cotal.<space>.audit.<decision>.<owner>.<actor>`.
func AuditSubject(space, decision, owner, actor string) string {
	return "cotal." + space + ".audit." + decision + "." + owner + "." + actor
}

// AuditStreamSubjects is the subject space of the audit stream.
func AuditStreamSubjects(space string) string { return "cotal." + space + ".audit.>" }

// The system account's requests the plane makes of the broker (a system-account user sends
// them; every server of a cluster answers).

// accountClaimsUpdate pushes an account JWT to every server's resolver.
func accountClaimsUpdate(account string) string {
	return "$SYS.REQ.ACCOUNT." + account + ".CLAIMS.UPDATE"
}

// AccountClaimsLookup asks every server's resolver for the account JWT it holds.
func AccountClaimsLookup(account string) string {
	return "$SYS.REQ.ACCOUNT." + account + ".CLAIMS.LOOKUP"
}

// AccountInfo is the subject every server answers with what it holds of account: its JWT.
func AccountInfo(account string) string { return "$SYS.REQ.ACCOUNT." + account + ".INFO" }

// AccountConnz asks every server for the account's connections.
func AccountConnz(account string) string { return "$SYS.REQ.ACCOUNT." + account + ".CONNZ" }

// ServerPing asks every server for its statistics: how the plane counts a cluster's servers.
const ServerPing = "$SYS.REQ.SERVER.PING"

// ServerVarz asks every server for its configuration: how the plane reads whether each one
// syncs every JetStream write to disk.
const ServerVarz = "$SYS.REQ.SERVER.PING.VARZ"

// ServerIDs asks every server for its id, new at each start: how the plane sees a server
// (re)join.
const ServerIDs = "$SYS.REQ.SERVER.PING.IDZ"

// AccountConnectEvents and AccountDisconnectEvents are where every server announces a client
// connection of the account opening and closing: how the plane counts each principal's
// connections.
func AccountConnectEvents(account string) string { return "$SYS.ACCOUNT." + account + ".CONNECT" }

// AccountDisconnectEvents: see AccountConnectEvents.
func AccountDisconnectEvents(account string) string {
	return "$SYS.ACCOUNT." + account + ".DISCONNECT"
}

// ServerKick asks the server with id server to close one client connection (by its cid).
func ServerKick(server string) string { return "$SYS.REQ.SERVER." + server + ".KICK" }

// PlaneUserPrefix starts the name of every user the plane mints for its own connections
// (`plane.serving_<instance>`): no principal's name does (an owner starts `u_` or `p_`).
const PlaneUserPrefix = "plane."
