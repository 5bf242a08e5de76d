package tenant

// Joined is how many lookups wait for another caller's lookup of the same token or name.
func (a *Authenticator) Joined() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.joined
}

// Looking is how many lookups are under way (one per token or name).
func (a *Authenticator) Looking() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.flights)
}

// CachedTokens is how many answers for bearer tokens are cached, known and unknown.
func (a *Authenticator) CachedTokens() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.entries) + len(a.unknown)
}
