package client

import (
	"context"

	"github.com/cotal-ai/authplane/subjects"
)

// Kinds of the platform supervisor's requests (docs/PROTOCOL.md, "supervisor-assign" to "supervisor-end").
const (
	KindAssign              = "platform-supervisor-assign"
	KindSupervisorAuthority = "platform-supervisor-authority"
	KindEnd                 = "platform-supervisor-end"
	// KindAssignment is the `kind` of an assignment record.
	KindAssignment = "platform-supervisor"
)

// States of an assignment: assigned → ending (an end began; it authorizes nothing, and the
// owner gets no new assignment until the end is complete) → ended (the end's outcome is
// settled). Ended is terminal.
const (
	StateAssigned = "assigned"
	StateEnding   = "ending"
	StateEnded    = "ended"
)

// Assign is the body of a supervisor-assign request: run owner's manager instance (its
// lifecycle) on the owner's behalf until ExpiresAt (seconds).
type Assign struct {
	V            int    `json:"v"`
	Kind         string `json:"kind"`
	Owner        string `json:"owner"`
	InstanceID   string `json:"instanceId"`
	LifecycleUID string `json:"lifecycleUid"`
	ExpiresAt    int64  `json:"expiresAt"`
}

// Assignment is an owner's platform supervisor assignment, the reply to supervisor-assign: the
// plane keeps it as it is (with a nonce of its own) but for Revision, the KV revision of the
// row, which is what supervisor-authority names.
type Assignment struct {
	V                int      `json:"v"`
	Kind             string   `json:"kind"`
	Owner            string   `json:"owner"`
	Space            string   `json:"space"`
	AccountPublicKey string   `json:"accountPublicKey"`
	InstanceID       string   `json:"instanceId"`
	LifecycleUID     string   `json:"lifecycleUid"`
	State            string   `json:"state"`
	ExpiresAt        int64    `json:"expiresAt"`
	Scope            []string `json:"scope"`
	AssignedBy       string   `json:"assignedBy"`
	Revision         uint64   `json:"revision,omitempty"`
}

// SupervisorAuthority is the body of a supervisor-authority request: a manager-service-authority
// request (its actor "cli") sent by a platform admin under owner's assignment at
// AssignmentRevision.
type SupervisorAuthority struct {
	V                  int              `json:"v"`
	Kind               string           `json:"kind"`
	Owner              string           `json:"owner"`
	AssignmentRevision uint64           `json:"assignmentRevision"`
	Request            ServiceAuthority `json:"request"`
}

// End is the body of a supervisor-end request: end owner's assignment, which names this
// instance and lifecycle, for reason.
type End struct {
	V            int    `json:"v"`
	Kind         string `json:"kind"`
	Owner        string `json:"owner"`
	InstanceID   string `json:"instanceId"`
	LifecycleUID string `json:"lifecycleUid"`
	Reason       string `json:"reason"`
}

// EndReport is the reply to supervisor-end, and the details of its refusals
// resource-exhausted and unavailable: what the end did, as the stores and the broker confirmed
// it. A repeat completes whatever an earlier end left undone and reports the same.
type EndReport struct {
	Owner        string `json:"owner"`
	InstanceID   string `json:"instanceId"`
	LifecycleUID string `json:"lifecycleUid"`
	Assignment   struct {
		State    string `json:"state"`
		Revision uint64 `json:"revision"`
	} `json:"assignment"`
	Retired struct {
		// Generations are the supervisor and executor generations retired.
		Generations []Generation `json:"generations"`
		// Gate is the state of the instance's gate: "retired".
		Gate string `json:"gate"`
	} `json:"retired"`
	Revoked struct {
		// Done says every server of the broker holds an account JWT that revokes every key of
		// NKeys, read back from each; Reason says why not.
		Done bool `json:"done"`
		// NKeys are the keys the instance claimed that credentials were minted for: what the
		// end revokes.
		NKeys []string `json:"nkeys"`
		// Unrevoked are those of NKeys the broker is not known to revoke: past the revocation
		// set's ceiling, without the operator signing key, or not confirmed by the deadline.
		// Their credentials expire at their clamp.
		Unrevoked []string `json:"unrevoked,omitempty"`
		Reason    string   `json:"reason,omitempty"`
	} `json:"revoked"`
	Evicted struct {
		// Count is how many of NKeys the broker's connection listing shows with no connection
		// left; Complete says that is all of them.
		Count    int  `json:"count"`
		Complete bool `json:"complete"`
	} `json:"evicted"`
	// Done says the end is complete: the assignment ended, the gate and generations retired,
	// every key revoked at every server, and no connection of one left.
	Done bool `json:"done"`
}

// Generation names one issued generation of a duty.
type Generation struct {
	Duty       string `json:"duty"`
	Generation string `json:"generation"`
}

// Assign writes owner's platform supervisor assignment (supervisor-assign). The caller needs
// scope `platform-admin`.
func (c *Client) Assign(ctx context.Context, body Assign) (*Assignment, error) {
	body.V, body.Kind = 1, KindAssign
	var a Assignment
	if err := c.call(ctx, subjects.EndpointSupervisorAssign, body, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// SupervisorBody returns the supervisor-authority body of operation op for owner's manager m
// under the assignment at revision: its inner request is the CLI's ("cli"), whatever this
// client's actor.
func (c *Client) SupervisorBody(owner string, revision uint64, op string, m Manager) SupervisorAuthority {
	inner := (&Client{space: c.space, actor: "cli"}).Body(op, m)
	return SupervisorAuthority{V: 1, Kind: KindSupervisorAuthority, Owner: owner, AssignmentRevision: revision, Request: inner}
}

// SupervisorAuthority sends one supervisor-authority body and decodes the material: the
// operation's credentials, every expiry clamped to the assignment's end. The caller needs scope
// `platform-admin`.
func (c *Client) SupervisorAuthority(ctx context.Context, body SupervisorAuthority) (*Material, error) {
	var m Material
	if err := c.call(ctx, subjects.EndpointSupervisorAuthority, body, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// End ends owner's assignment (supervisor-end) and reports the end's final state; a repeat
// reports the same. The caller needs scope `platform-admin`.
func (c *Client) End(ctx context.Context, body End) (*EndReport, error) {
	body.V, body.Kind = 1, KindEnd
	var r EndReport
	if err := c.call(ctx, subjects.EndpointSupervisorEnd, body, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
