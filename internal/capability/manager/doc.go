// Package manager is manager-service authority (docs/PROTOCOL.md, "manager-authority"): the registration a gate
// carries, the keyed proofs, and the operations prepare, activate, renew and
// renewStandingBundle. Each checks its fences and builds a plan for the issuance pipeline
// (package issue), which signs, records `minted` and commits on the manager's gate before a
// credential leaves; this package only shapes the request and the reply. It also keeps the actor
// ledger (actors.go), the scopes every request's authority is read from.
package manager
