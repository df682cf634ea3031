// Package subjects builds and parses every NATS subject, inbox, KV key, bucket name and
// credential permission of the authority plane, so the wire contract lives in one place.
// It also makes the identifiers the plane and its tools hand out (instance ids, lifecycle uids,
// request ids, nonces and secrets), from crypto/rand. It imports nothing of ours.
package subjects
