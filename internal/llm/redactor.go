package llm

// Redactor removes one API key from text a provider sent, in every form this package removes it
// from its own calls' answers (see redact.go): for code that talks to a provider without Send,
// such as the batch lane, whose answers are as untrusted. The zero Redactor (no key) only
// sanitises. It is a value; safe for concurrent use.
type Redactor struct{ r redactor }

// NewRedactor returns the Redactor of key.
func NewRedactor(key string) Redactor { return Redactor{r: newRedactor(key)} }

// Clean makes s fit to store, log and show: control characters and invalid UTF-8 replaced, the
// key redacted, then cut to at most n bytes (plus the cut mark).
func (r Redactor) Clean(s string, n int) string { return r.r.clean(s, n) }

// Mask overwrites every form of the key in b, in place and byte for byte, so that a JSON body
// keeps its length and, the key being inside a string, its validity. It reports whether anything
// was masked.
func (r Redactor) Mask(b []byte) bool { return r.r.maskBytes(b) }
