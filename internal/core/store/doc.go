// Package store owns the plane's JetStream state: every bucket and stream docs/OPERATIONS.md lists ("What it runs"),
// created by hand with the configuration its rule needs and checked at every start, and the
// KV verbs the fences use (leader reads, create-if-absent that respects delete markers, CAS
// that tells a lost race from an unknown outcome).
package store
