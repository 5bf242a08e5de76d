package tenant

// Joined is how many lookups wait for another caller's lookup of the same token or name.
func (a *Authenticator) Joined() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.joined
}
