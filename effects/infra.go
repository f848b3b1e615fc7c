package effects

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// IsInfrastructure reports whether err is a failure of the infrastructure
// under a request rather than of the request itself: a lost or refused
// connection, a connection closed mid-query, a timeout or cancelled context,
// a pool that is shutting down, or a Postgres error of a class that another
// attempt may pass (08 connection exception, 40 serialization failure or
// deadlock, 53 insufficient resources, 57 operator intervention such as
// admin shutdown, "cannot connect now" or a statement timeout, and 55P03
// lock not available). IsTransient includes it: such a failure is retried
// with the same key, never stored as terminal.
func IsInfrastructure(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "55P03":
			return true
		case len(pgErr.Code) < 2:
			return false
		}
		switch pgErr.Code[:2] {
		case "08", "40", "53", "57":
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connectErr), pgconn.Timeout(err), pgconn.SafeToRetry(err), errors.As(err, &netErr),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, pgconn.ErrConnClosed),
		errors.Is(err, puddle.ErrClosedPool), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, net.ErrClosed):
		return true
	}
	return false
}
