package outbox

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// NotifyChannel prefixes the Postgres channel EnqueueTx notifies on commit.
// Channels are database-wide, so deployments in two schemas of one database
// must not wake each other's relays: the full name is Channel(schema).
const NotifyChannel = "keyed_outbox"

// Channel returns the channel on which EnqueueTx notifies and Listen listens
// for schema: NotifyChannel, a dot and the hex MD5 of the schema name (45
// bytes, within Postgres's 63-byte limit, whatever the schema).
func Channel(schema string) string {
	sum := md5.Sum([]byte(schema))
	return NotifyChannel + "." + hex.EncodeToString(sum[:])
}

// channelSQL computes Channel(current_schema()) in SQL.
const channelSQL = `'` + NotifyChannel + `.' || md5(current_schema())`

// Listen holds one connection of pool listening on the outbox channel of the
// pool's current schema, and sends on wake (non-blocking) whenever an enqueue
// commits; pass the same channel as RelayOpts.Wake. A lost connection is
// logged and re-established with backoff. It returns when ctx is done.
func Listen(ctx context.Context, pool *pgxpool.Pool, wake chan<- struct{}, logger *slog.Logger) {
	if logger == nil {
		logger = slog.Default()
	}
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		err := listenOnce(ctx, pool, wake)
		if ctx.Err() != nil {
			return
		}
		logger.WarnContext(ctx, "outbox listener lost its connection; polling continues", "error", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

func listenOnce(ctx context.Context, pool *pgxpool.Pool, wake chan<- struct{}) error {
	pooled, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A connection that was listening must not go back to the pool: take it
	// out for good and close it when done.
	conn := pooled.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	var channel string
	if err := conn.QueryRow(ctx, `SELECT `+channelSQL).Scan(&channel); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	// Rows committed before LISTEN took effect are found by the relay's
	// first poll; wake it once so that poll happens now.
	signal(wake)
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return ctx.Err()
			}
			return err
		}
		signal(wake)
	}
}

func signal(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
