package handlers

import "sync"

// slots counts requests in flight per key (a peer), each key at most max at once. A key is kept
// only while it holds a slot, so the map is never larger than the requests in flight.
type slots struct {
	max    int
	mu     sync.Mutex
	byPeer map[string]int
}

func newSlots(max int) *slots { return &slots{max: max, byPeer: map[string]int{}} }

// take gives key one more slot, or reports that it holds max already.
func (s *slots) take(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byPeer[key] >= s.max {
		return false
	}
	s.byPeer[key]++
	return true
}

// give returns one of key's slots.
func (s *slots) give(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byPeer[key]--; s.byPeer[key] <= 0 {
		delete(s.byPeer, key)
	}
}
