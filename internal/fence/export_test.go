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
