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

// IsInfrastructure reports whether err is a failure under the request rather
// than of it: a lost, refused or closed connection, a timeout or cancelled
// context, a closing pool, or a Postgres error of class 08, 40, 53, 57 or
// code 55P03. IsTransient includes it.
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
