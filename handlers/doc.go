// Package handlers serves the plane's endpoints: one file per endpoint, the one guard every
// call passes whatever carried it (the caller, the rate limit, the deadline, the plane's own
// fence, the refusal record), and the bus transport (a micro service instance whose endpoints
// hand each request to a bounded pool, answering only into the caller's own inbox). The wire forms of a refusal come from package fault's table.
package handlers
