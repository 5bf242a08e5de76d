// Package operator keeps the console's operators and their sessions in Postgres (tables
// operators and operator_sessions, migration 015).
//
// An operator is not a tenant: it sees and acts on every tenant's jobs, through the console at
// /console/. Its token (prefix "llmqop_", so that it is never mistaken for a tenant's "llmq_")
// is shown once by `ctl operators create` and only its SHA-256 is stored. The console exchanges
// it for a session: a random session token (in an HttpOnly cookie; also stored only as a hash)
// and a CSRF token that the page sends back with every action.
package operator
