//go:build !unix

package httpserve

// openFileLimit is unknown here: the default cap is MaxDefaultConnections.
func openFileLimit() int { return 0 }
