// Package handlers serves the plane's micro endpoints: one file per endpoint, and the one
// table that turns a domain refusal into a wire error. Every request first passes the reply
// check (answered only into the caller's own inbox), the per-principal rate limit and a
// deadline; every refusal past them is recorded.
package handlers
