// Package supervisor is the platform supervisor (docs/PROTOCOL.md, "supervisor-assign" to "supervisor-end"): a platform admin runs a manager
// on an owner's behalf under an assignment with an end. It owns the assignment row, the issued
// evidence and write-once accepted rows of the supervisor and executor generations, the
// ended-assignment fence, supervisor-end's five steps, and the data account's revocation set
// that the end adds to and every start re-applies at the broker. Issuance itself is the
// manager engine's operations run under a Supervision, through the one pipeline.
package supervisor
