package handlers

import (
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/subjects"
)

// onAnswer is a request whose answer runs next, as a caller that sends its next call when the
// answer arrives does.
type onAnswer struct {
	micro.Request
	next func()
}

func (r *onAnswer) Respond([]byte, ...micro.RespondOpt) error { r.next(); return nil }

func (r *onAnswer) Error(string, string, []byte, ...micro.RespondOpt) error { r.next(); return nil }

// An owner that keeps --owner-in-flight calls under way, sending the next as each answer
// arrives, is never refused: a call leaves the guard before its answer is sent.
func TestACallLeavesItsOwnersSlotBeforeItsAnswerIsSent(t *testing.T) {
	e := newGuardEnv(0, 0)
	e.g.OwnerInFlight = 1
	var n atomic.Int32
	h := &endpoint{bus: &Bus{Space: "default", Guard: e.g, Log: slog.New(slog.DiscardHandler)}, name: subjects.EndpointManagerAuthority,
		fn: counting(&n, map[string]string{"ok": "yes"}, nil)}
	c := call("cli", "{}")
	leave, refusal := e.g.Enter(c)
	if refusal != nil {
		t.Fatal(refusal)
	}
	answered := false
	h.serve(&onAnswer{next: func() {
		answered = true
		next, refusal := e.g.Enter(c)
		if refusal != nil {
			t.Errorf("the owner's next call, sent as the answer arrived: %v; want it let in", refusal)
			return
		}
		next()
	}}, c, leave)
	if !answered || n.Load() != 1 {
		t.Fatalf("answered %v after %d calls of the handler, want the one call answered", answered, n.Load())
	}
}
