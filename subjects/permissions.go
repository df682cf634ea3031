package subjects

import (
	"fmt"
	"strings"
)

// Duty names one kind of credential the plane mints (docs/PROTOCOL.md, "What each credential may do").
type Duty string

// The duties, in the table's order.
const (
	DutySupervisor    Duty = "supervisor"
	DutyExecutor      Duty = "executor"
	DutyServe         Duty = "serve"
	DutyGoalWriter    Duty = "goalWriter"
	DutySessionLedger Duty = "sessionLedger"
	DutyDriver        Duty = "driver"
	DutyMediator      Duty = "mediator"
	DutyCaller        Duty = "caller"
	// DutyOps is a caller that may also discover the service (`nats micro ls|info|stats|ping`):
	// micro answers `$SRV` requests itself, without the plane's reply check, so only an
	// operator may send them.
	DutyOps Duty = "ops"
)

// StandingDuties are the five duties of a manager instance, in the order the registration's
// identities digest covers them.
var StandingDuties = []Duty{DutySupervisor, DutyExecutor, DutyServe, DutyGoalWriter, DutySessionLedger}

// Permissions are what one credential may do: the subjects it may publish and subscribe.
// Anything else is denied by the broker. (Ledger scopes are another thing: see the ledger.)
type Permissions struct {
	Pub []string
	Sub []string
}

// Holder names whose credential a set of permissions is for.
type Holder struct {
	Space    string
	Owner    string
	Actor    string // the caller's actor; set for DutyCaller, derived for every other duty
	Instance string // the manager instance, for manager and run duties
	RunID    string // for DutyDriver and DutyMediator
}

// DutyActor is the actor of a duty's principal; DutyCaller and DutyOps have no fixed actor.
func DutyActor(d Duty, iid, runID string) string {
	switch d {
	case DutySupervisor:
		return SupervisorActor(iid)
	case DutyExecutor:
		return ExecutorActor(iid)
	case DutyServe:
		return ServeActor(iid)
	case DutyGoalWriter:
		return GoalWriterActor(iid)
	case DutySessionLedger:
		return SessionLedgerActor(iid)
	case DutyDriver, DutyMediator:
		return RunActor(runID)
	}
	return ""
}

// PermissionsOf is docs/PROTOCOL.md's table "What each credential may do", as code: the permissions of duty d for holder h. Every
// credential may publish its own principal's plane subjects and subscribe its own inbox;
// nothing more unless the table says so. It returns the principal's actor with them.
func PermissionsOf(d Duty, h Holder) (actor string, g Permissions, err error) {
	actor = h.Actor
	if d != DutyCaller && d != DutyOps {
		actor = DutyActor(d, h.Instance, h.RunID)
	}
	if actor == "" {
		return "", Permissions{}, fmt.Errorf("unknown duty %q", d)
	}
	sp := "cotal." + h.Space
	g = Permissions{
		Pub: []string{CallerSubjects(h.Space, h.Owner, actor)},
		Sub: []string{InboxPrefix(h.Owner, actor) + ".>"},
	}
	switch d {
	case DutySupervisor, DutyExecutor:
		// Nothing more: they call the plane as themselves.
	case DutyServe:
		g.Sub = append(g.Sub,
			sp+".ep.v1.one.manager.run-start."+h.Owner+".> manager."+h.Owner,
			sp+".ep.v1.all.manager.run-start."+h.Owner+".>",
			sp+".ep.v1.inst.manager."+h.Instance+".>",
		)
		g.Pub = append(g.Pub, sp+".ep.reply.manager."+h.Instance+".>")
	case DutyGoalWriter:
		g.Pub = append(g.Pub, sp+".goal."+h.Owner+".>")
	case DutySessionLedger:
		g.Pub = append(g.Pub, sp+".session."+h.Owner+".>")
	case DutyDriver:
		g.Pub = append(g.Pub, sp+".wfj."+h.RunID)
	case DutyMediator:
		g.Pub = append(g.Pub, sp+".ep.reply.manager."+h.Instance+".>")
	case DutyCaller, DutyOps:
		g.Pub = append(g.Pub,
			sp+".ep.v1.one.manager.run-start."+h.Owner+"."+actor+".>",
			sp+".ep.v1.all.manager.run-start."+h.Owner+"."+actor+".>",
			sp+".ep.v1.inst.manager.*.run-start."+h.Owner+"."+actor+".>",
		)
		g.Sub = append(g.Sub, sp+".ep.reply.manager.*.*."+h.Owner+"."+actor+".>")
		if d == DutyOps {
			g.Pub = append(g.Pub, "$SRV.PING", "$SRV.INFO", "$SRV.STATS", "$SRV.*."+ServiceName, "$SRV.*."+ServiceName+".>")
		}
	default:
		return "", Permissions{}, fmt.Errorf("unknown duty %q", d)
	}
	return actor, g, nil
}

// ServingPermissions are those of the plane's serving connection, a data-account user: it
// receives endpoint requests and `$SRV` discovery, and may publish only into inboxes. It has
// no response permission, which would override this deny-by-default list.
func ServingPermissions(space string) Permissions {
	return Permissions{
		Pub: []string{"_INBOX.>"},
		Sub: []string{AuthPrefix(space) + ".>", "$SRV.>"},
	}
}

// StorePermissions are those of the plane's store connection, a plane-account user: the JetStream
// API, its buckets and record streams, and nothing but its own inbox to subscribe.
func StorePermissions(space string) Permissions {
	return Permissions{
		Pub: []string{"$JS.API.>", "$KV.>", MintedStreamSubjects(space), AuditStreamSubjects(space)},
		Sub: []string{"_INBOX.>"},
	}
}

// SystemPermissions are those of the plane's system-account user: it pushes the data and plane
// accounts' JWTs to the broker's resolvers, reads the data account's back from each, lists that
// account's connections on each server, hears them open and close, kicks one past its budget,
// counts the servers and reads each one's configuration (does it sync every write); nothing
// else, and for no other account (a kick names a server and a connection id, not an account:
// the plane kicks only what the data account's events named).
func SystemPermissions(dataAccount, planeAccount string) Permissions {
	return Permissions{
		Pub: []string{
			AccountClaimsUpdate(dataAccount),
			AccountClaimsUpdate(planeAccount),
			AccountClaimsLookup(dataAccount),
			AccountClaimsLookup(planeAccount),
			AccountConnz(dataAccount),
			ServerKick("*"),
			ServerPing,
			ServerVarz,
		},
		Sub: []string{"_INBOX.>", AccountConnectEvents(dataAccount), AccountDisconnectEvents(dataAccount)},
	}
}

// KickPermissions are those of the system-account user an operator's command connects as to
// close a principal's connections (`authplane agent --revoke`): it lists the data account's
// connections, kicks them, and counts the servers.
func KickPermissions(dataAccount string) Permissions {
	return Permissions{
		Pub: []string{AccountConnz(dataAccount), ServerKick("*"), ServerPing},
		Sub: []string{"_INBOX.>"},
	}
}

// Auditors read the minted and audit streams with the stock `nats` CLI. They are not users of
// the plane account: a JetStream API request there is answered on whatever reply subject its
// sender chose, with the account's rights, so even a stream-info-only user there could write
// any bucket's key. An auditor is a data-account user (no JetStream there) that may publish
// only the read API of those two streams, which the plane account exports and the data account
// imports under AuditorAPIPrefix: every answer comes back through the import to the auditor's
// inbox, in an account where no stream can store it.

// AuditorAPIPrefix is the JetStream API prefix of an auditor's requests (`nats
// --js-api-prefix`, jetstream.NewWithAPIPrefix).
func AuditorAPIPrefix(space string) string { return "cotal." + space + ".auditor" }

// AuditorInboxPrefix is the inbox prefix of every auditor credential (`nats --inbox-prefix`).
// No caller's inbox is under it: an owner token starts `u_` or `p_`.
const AuditorInboxPrefix = "_INBOX.auditor"

// AuditorRead is one subject of the plane account that the data account imports for auditors:
// Remote is its subject in the plane account, Local in the data account. Stream says one
// request may get many answers (a pull consumer's batch).
type AuditorRead struct {
	Remote string
	Local  string
	Stream bool
}

// AuditedStreams are the streams an auditor reads: the minted and audit streams.
func AuditedStreams(space string) []string { return []string{MintedStream(space), AuditStream(space)} }

// AuditorReads is what docs/PROTOCOL.md lets an auditor do ("What each credential may do"), as imports: for the minted and audit
// streams, stream info, message gets (the record streams allow no direct gets), and pull
// consumers (create, info, pull, ack, delete a consumer: how `nats stream
// view` pages). A consumer's creation goes to the plane, not to JetStream (AuditorConsumers):
// broker permissions cannot see a consumer's deliver_subject, so the plane refuses a push
// consumer before JetStream sees it. Nothing that writes, deletes or purges a message, and no
// bucket.
func AuditorReads(space string) []AuditorRead {
	api := AuditorAPIPrefix(space)
	var reads []AuditorRead
	for _, st := range AuditedStreams(space) {
		create := AuditorConsumers(space, st) + ".>"
		reads = append(reads, AuditorRead{Remote: create, Local: create})
		for _, verb := range []string{"STREAM.INFO." + st, "STREAM.MSG.GET." + st,
			"CONSUMER.INFO." + st + ".*", "CONSUMER.MSG.NEXT." + st + ".*", "CONSUMER.DELETE." + st + ".*"} {
			reads = append(reads, AuditorRead{Remote: "$JS.API." + verb, Local: api + "." + verb, Stream: strings.HasPrefix(verb, "CONSUMER.MSG.NEXT.")})
		}
		ack := "$JS.ACK." + st + ".>"
		reads = append(reads, AuditorRead{Remote: ack, Local: ack})
	}
	return reads
}

// AuditorConsumers is where the plane takes an auditor's consumer creations for stream st, in
// the plane account and, imported under the same name, in the data account: the auditor's
// `<api prefix>.CONSUMER.CREATE.<st>`, followed by the consumer's name (and filter) as
// JetStream's API has them. The plane passes a pull consumer on to `$JS.API.CONSUMER.CREATE.<st>.…`.
func AuditorConsumers(space, st string) string {
	return AuditorAPIPrefix(space) + ".CONSUMER.CREATE." + st
}

// JetStreamConsumerCreate is JetStream's own subject for the consumer creation an auditor sent
// on subject (under AuditorConsumers of one of AuditedStreams), or "" when subject is none.
func JetStreamConsumerCreate(space, subject string) string {
	for _, st := range AuditedStreams(space) {
		if rest, ok := strings.CutPrefix(subject, AuditorConsumers(space, st)+"."); ok && rest != "" {
			return "$JS.API.CONSUMER.CREATE." + st + "." + rest
		}
	}
	return ""
}

// AuditorsPermissions are those of the plane's auditors connection, a plane-account user: it
// takes the auditors' consumer creations (a queue subscription under AuditorConsumers), passes
// them to JetStream's create API of those two streams only, answers into the import's reply
// subjects (`_R_.…`), and subscribes its own inbox for JetStream's answers.
func AuditorsPermissions(space string) Permissions {
	var g Permissions
	for _, st := range AuditedStreams(space) {
		g.Pub = append(g.Pub, "$JS.API.CONSUMER.CREATE."+st+".>")
		g.Sub = append(g.Sub, AuditorConsumers(space, st)+".>")
	}
	g.Pub = append(g.Pub, "_R_.>")
	g.Sub = append(g.Sub, "_INBOX.>")
	return g
}

// AuditorPermissions are those of an auditor credential (`authplane creds --role auditor`): it
// may publish the imported read subjects and subscribe its own inbox, nothing else.
func AuditorPermissions(space string) Permissions {
	g := Permissions{Sub: []string{AuditorInboxPrefix + ".>"}}
	for _, r := range AuditorReads(space) {
		g.Pub = append(g.Pub, r.Local)
	}
	return g
}

// CalloutPermissions are those of the plane's callout user, of the callout account: it
// receives the broker's authorization requests and answers into the broker's reply inboxes,
// and nothing else.
func CalloutPermissions() Permissions {
	return Permissions{
		Pub: []string{"$SYS._INBOX.>"},
		Sub: []string{"$SYS.REQ.USER.AUTH"},
	}
}
