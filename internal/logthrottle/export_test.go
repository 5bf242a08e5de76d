package logthrottle

// Keys is how many keys t keeps.
func Keys(t *Throttle) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.keys)
}
