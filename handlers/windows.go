package handlers

import (
	"container/list"
	"sync"
	"time"
)

// windows counts events per key over the last minute (a peer's refusals, bad capabilities),
// keeping at most peerBuckets keys: the one touched least recently goes first, so a flood of
// fresh peers cannot grow it.
type windows struct {
	mu    sync.Mutex
	order *list.List // of *window, most recently touched first
	byKey map[string]*list.Element
}

type window struct {
	key   string
	times []time.Time
}

func newWindows() *windows { return &windows{order: list.New(), byKey: map[string]*list.Element{}} }

// record counts one event of key at now.
func (w *windows) record(key string, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.byKey[key]
	if ok {
		w.order.MoveToFront(e)
	} else {
		if w.order.Len() >= peerBuckets {
			oldest := w.order.Back()
			w.order.Remove(oldest)
			delete(w.byKey, oldest.Value.(*window).key)
		}
		e = w.order.PushFront(&window{key: key})
		w.byKey[key] = e
	}
	win := e.Value.(*window)
	win.times = append(prune(win.times, now), now)
}

// count is how many events of key fell in the minute before now.
func (w *windows) count(key string, now time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.byKey[key]
	if !ok {
		return 0
	}
	win := e.Value.(*window)
	win.times = prune(win.times, now)
	return len(win.times)
}

// prune drops the times more than a minute before now.
func prune(times []time.Time, now time.Time) []time.Time {
	i := 0
	for i < len(times) && now.Sub(times[i]) >= time.Minute {
		i++
	}
	return times[i:]
}
