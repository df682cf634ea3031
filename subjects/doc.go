// Package subjects builds and parses every NATS subject, inbox, KV key, bucket name and
// credential permission of the authority plane, so the wire contract lives in one place.
// It imports nothing of ours.
package subjects
