package fence

// Waiting is how many commits on key wait for the next group.
func (g *Grouped) Waiting(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if q := g.queues[key]; q != nil {
		return len(q.waiting)
	}
	return 0
}

// Sharing is how many Gets of key wait for the next shared get.
func (s *Shared) Sharing(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.reads[key]; r != nil {
		return r.waiting
	}
	return 0
}
