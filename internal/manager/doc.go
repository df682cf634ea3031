// Package manager is manager-service authority (DESIGN §6.1, §6.2): the registration a gate
// carries, the keyed proofs, and the operations prepare, activate, renew and
// renewStandingBundle, each of which reads its fences, signs, records `minted` and commits on
// the manager's gate before a credential leaves.
package manager
