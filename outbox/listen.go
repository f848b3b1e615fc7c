package outbox

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// NotifyChannel prefixes the Postgres channel EnqueueTx notifies on commit.
// The full name adds the current schema, "keyed_outbox.public", because
// channels are database-wide: deployments in two schemas of one database
// must not wake each other's relays.
const NotifyChannel = "keyed_outbox"

// channelSQL computes the schema's channel name in SQL.
const channelSQL = `'` + NotifyChannel + `.' || current_schema()`

// Listen holds one connection of pool listening on the outbox channel of
// the pool's current schema until ctx is done, and sends on wake (without
// blocking; one pending wake is enough) whenever a transaction that enqueued
// a start commits. Pass the same
// channel as RelayOpts.Wake, so that a start reaches Temporal milliseconds
// after the commit instead of at the next poll. A lost connection is logged
// and re-established with backoff; polling goes on meanwhile, so nothing
// depends on a notification arriving. Listen returns when ctx is done.
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
