// Package proptest holds the property test of the tenant-safe core: random schedules of every
// lifecycle operation (prepare, activate, renew, run admission and attempt, supervisor assign,
// authority and end), run concurrently over in-memory stores through the real engine,
// supervisor, pipeline, claims and signer set, with crashes and store faults injected
// between their steps; after every schedule the stores must keep the invariants its test
// names. The package has no code of its own.
package proptest
