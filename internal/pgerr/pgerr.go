// Package pgerr classifies Postgres errors for the callers that must tell "Postgres is not
// there right now" from "this statement is wrong".
package pgerr

import (
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// readOnlyTransaction is SQLSTATE read_only_sql_transaction: a write refused by a server that
// takes only reads.
const readOnlyTransaction = "25006"

// lockNotAvailable is SQLSTATE lock_not_available: a statement that waited for a lock past the
// session's lock_timeout (or a NOWAIT that found the lock taken).
const lockNotAvailable = "55P03"

// Unavailable reports whether err means Postgres could not be reached or dropped the connection
// (as opposed to a bad query or a constraint): a refused or failed connect, a server shutting
// down, starting up or out of connections (SQLSTATE classes 08, 53 and 57), a server that
// refuses writes (25006 read_only_sql_transaction: during a failover, a connection that landed
// on a standby not yet promoted, or on a server set default_transaction_read_only), a statement
// that waited for a lock past the session's lock_timeout (55P03 lock_not_available: a lock a
// long transaction holds, as a statement_timeout's 57014 is for a statement), a connection reset
// or closed under a query, a timeout. Trying again later can succeed; nil is not unavailable.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "53", "57":
			return true
		}
		return pgErr.Code == readOnlyTransaction || pgErr.Code == lockNotAvailable
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed)
}
