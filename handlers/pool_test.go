package handlers

import (
	"testing"
	"time"
)

// A stop with nothing under way reports the answers sent even with its deadline passed (a
// --drain-timeout of 0), and so does a second stop of the same generation (a fenced plane
// stops its services, then closes).
func TestPoolWaitWithNothingUnderWayIsDoneAtOnceAndAgain(t *testing.T) {
	t.Parallel()
	p := newPool(nil, 4)
	if !p.wait(time.Now().Add(-time.Second)) {
		t.Fatal("the first wait, nothing under way, deadline passed: reported answers under way")
	}
	began := time.Now()
	if !p.wait(time.Now().Add(time.Minute)) {
		t.Fatal("a second wait: reported answers under way")
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("a second wait took %s, want it at once", took)
	}
	if !p.isStopped() {
		t.Fatal("after a wait the services are not marked stopped")
	}
}

// A stop with an answer under way reports it unsent at its deadline, and sent once it is:
// a later wait sees the slot the answer gave back.
func TestPoolWaitWaitsForTheAnswerUnderWay(t *testing.T) {
	t.Parallel()
	p := newPool(nil, 4)
	p.slots <- struct{}{} // an answer under way
	if p.wait(time.Now().Add(50 * time.Millisecond)) {
		t.Fatal("a wait with an answer under way: reported every answer sent")
	}
	<-p.slots // the answer is sent
	if !p.wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("a wait after the answer was sent: reported answers under way")
	}
}
