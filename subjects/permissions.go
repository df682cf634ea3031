package subjects

import (
	"fmt"
	"slices"
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
		Pub: []string{callerSubjects(h.Space, h.Owner, actor)},
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
// counts the servers, reads each one's configuration (does it sync every write) and hears them
// (re)join; nothing else, and for no other account (a kick names a server and a connection id,
// not an account: the plane kicks only what the data account's events named).
func SystemPermissions(dataAccount, planeAccount string) Permissions {
	return Permissions{
		Pub: []string{
			accountClaimsUpdate(dataAccount),
			accountClaimsUpdate(planeAccount),
			AccountClaimsLookup(dataAccount),
			AccountClaimsLookup(planeAccount),
			AccountInfo(dataAccount),
			AccountConnz(dataAccount),
			ServerKick("*"),
			ServerPing,
			ServerVarz,
			ServerIDs,
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
// any bucket's key. An auditor is a data-account user (no JetStream there) with a name of its
// own, that may publish only the read API of those two streams under its own prefix
// (AuditorAPIPrefix), which the plane account exports and the data account imports: every
// answer comes back through the import to the auditor's inbox, in an account where no stream
// can store it. Each auditor has one reader (consumer) of each stream, named after it: the
// plane account maps an info or pull naming any consumer to the auditor's own (AuditorMappings),
// the plane makes and deletes only the auditor's own (AuditorCreate, AuditorDelete), and an ack
// names the consumer, so no auditor can read, ack, change or delete another's.

// AuditorAPIPrefix is the JetStream API prefix of auditor name's requests (`nats
// --js-api-prefix`, jetstream.NewWithAPIPrefix): its name is a token of every request, so the
// broker forge-locks it.
func AuditorAPIPrefix(space, name string) string { return auditorAPI(space) + "." + name }

func auditorAPI(space string) string { return "cotal." + space + ".auditor" }

// AuditorInboxPrefix is the inbox prefix of auditor name's credential (`nats --inbox-prefix`).
// No caller's inbox is under `_INBOX.auditor`: an owner token starts `u_` or `p_`.
func AuditorInboxPrefix(name string) string { return "_INBOX.auditor." + name }

// AuditorPrincipal is auditor name's principal, its user's name: every auditor is a principal
// of the one owner `auditor`.
func AuditorPrincipal(name string) string { return "auditor." + name }

// AuditorConsumer is the name of auditor name's one consumer of each audited stream: its name.
func AuditorConsumer(name string) string { return name }

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

// AuditorReads is what docs/PROTOCOL.md lets an auditor do ("What each credential may do"), as
// imports: every auditor's API requests (for the minted and audit streams: stream info, message
// gets, and its own pull consumer: create, info, pull, ack, delete, how `nats stream view`
// pages), and the acks of those streams' messages. Nothing that writes, deletes or purges a
// message, and no bucket.
func AuditorReads(space string) []AuditorRead {
	api := auditorAPI(space) + ".*.>"
	reads := []AuditorRead{{Remote: api, Local: api, Stream: true}}
	for _, st := range AuditedStreams(space) {
		ack := "$JS.ACK." + st + ".>"
		reads = append(reads, AuditorRead{Remote: ack, Local: ack})
	}
	return reads
}

// Auditor request verbs.
const (
	AuditorStreamInfo     = "STREAM.INFO"
	AuditorMsgGet         = "STREAM.MSG.GET"
	AuditorConsumerCreate = "CONSUMER.CREATE"
	AuditorConsumerInfo   = "CONSUMER.INFO"
	AuditorConsumerDelete = "CONSUMER.DELETE"
	AuditorConsumerNext   = "CONSUMER.MSG.NEXT"
)

// AuditorMappings are the plane account's subject mappings of the auditors' requests, each to
// JetStream's own API: stream info and message gets as they are, and a consumer's info and pull
// to the auditor's own consumer (its name, the request's first wildcard), whatever consumer the
// request named. A consumer's creation and deletion are not mapped: the plane takes them
// (AuditorCreate, AuditorDelete).
func AuditorMappings(space string) map[string]string {
	api := auditorAPI(space) + ".*."
	m := map[string]string{}
	for _, st := range AuditedStreams(space) {
		m[api+AuditorStreamInfo+"."+st] = "$JS.API." + AuditorStreamInfo + "." + st
		m[api+AuditorMsgGet+"."+st] = "$JS.API." + AuditorMsgGet + "." + st
		for _, verb := range []string{AuditorConsumerInfo, AuditorConsumerNext} {
			m[api+verb+"."+st+".*"] = "$JS.API." + verb + "." + st + ".{{wildcard(1)}}"
		}
	}
	return m
}

// AuditorCreate parses subject, an auditor's consumer creation under AuditorAPIPrefix, into the
// auditor's name, the stream, the consumer it asked for, and the JetStream subject that creates
// the auditor's own consumer (its filter, if the request named one, kept). ok is false for
// anything else.
func AuditorCreate(space, subject string) (name, stream, asked, jetStream string, ok bool) {
	name, stream, asked, filter, ok := auditorConsumerRequest(space, subject, AuditorConsumerCreate)
	if !ok {
		return "", "", "", "", false
	}
	jetStream = "$JS.API." + AuditorConsumerCreate + "." + stream + "." + AuditorConsumer(name)
	if filter != "" {
		jetStream += "." + filter
	}
	return name, stream, asked, jetStream, true
}

// AuditorDelete parses subject, an auditor's consumer deletion under AuditorAPIPrefix, into the
// auditor's name, the stream and the consumer it named. ok is false for anything else.
func AuditorDelete(space, subject string) (name, stream, named string, ok bool) {
	name, stream, named, rest, ok := auditorConsumerRequest(space, subject, AuditorConsumerDelete)
	if !ok || rest != "" {
		return "", "", "", false
	}
	return name, stream, named, true
}

// auditorConsumerRequest parses subject, an auditor's request of verb about a consumer of the
// minted or audit stream, into the auditor's name, the stream, the consumer and what follows it.
func auditorConsumerRequest(space, subject, verb string) (name, stream, consumer, rest string, ok bool) {
	rest, ok = strings.CutPrefix(subject, auditorAPI(space)+".")
	name, rest, ok2 := strings.Cut(rest, ".")
	args, ok3 := strings.CutPrefix(rest, verb+".")
	if !ok || !ok2 || !ok3 || !ValidActor(name) {
		return "", "", "", "", false
	}
	stream, args, _ = strings.Cut(args, ".")
	consumer, rest, _ = strings.Cut(args, ".")
	if !slices.Contains(AuditedStreams(space), stream) || consumer == "" || len(consumer) > MaxConsumerName {
		return "", "", "", "", false
	}
	return name, stream, consumer, rest, true
}

// MaxConsumerName bounds the consumer name an auditor's request names: JetStream's own bound on
// a consumer's name. The plane keeps it in the reader's metadata and echoes it back.
const MaxConsumerName = 255

// AuditorsPermissions are those of the plane's auditors connection, a plane-account user: it
// takes the auditors' consumer creations and deletions (a queue subscription under the
// auditors' API; every other request is mapped to JetStream before it could reach it), passes
// them to JetStream's create, info and delete API of those two streams only, answers into the
// import's reply subjects (`_R_.…`), and subscribes its own inbox for JetStream's answers.
func AuditorsPermissions(space string) Permissions {
	g := Permissions{Sub: []string{auditorAPI(space) + ".*.>", "_INBOX.>"}, Pub: []string{"_R_.>"}}
	for _, st := range AuditedStreams(space) {
		g.Pub = append(g.Pub, "$JS.API.CONSUMER.CREATE."+st+".>", "$JS.API.CONSUMER.INFO."+st+".*", "$JS.API.CONSUMER.DELETE."+st+".*")
	}
	return g
}

// AuditorPermissions are those of auditor name's credential (`authplane creds --role auditor
// --actor <name>`): it may publish its own API requests of the verbs above, on the minted and
// audit streams, and the acks of its own consumer's messages, and subscribe its own inbox,
// nothing else.
func AuditorPermissions(space, name string) Permissions {
	api := AuditorAPIPrefix(space, name)
	g := Permissions{Sub: []string{AuditorInboxPrefix(name) + ".>"}}
	for _, st := range AuditedStreams(space) {
		g.Pub = append(g.Pub, api+"."+AuditorStreamInfo+"."+st, api+"."+AuditorMsgGet+"."+st, api+"."+AuditorConsumerCreate+"."+st+".>",
			api+"."+AuditorConsumerInfo+"."+st+".*", api+"."+AuditorConsumerDelete+"."+st+".*", api+"."+AuditorConsumerNext+"."+st+".*",
			"$JS.ACK."+st+"."+AuditorConsumer(name)+".>")
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
