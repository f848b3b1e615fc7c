package effects

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// LockEntityTx serializes work on one entity, such as an order, without
// serializing anything else: it takes a Postgres advisory lock on entity's
// key for the life of tx, waiting while another transaction holds it. The
// lock goes when tx commits or rolls back, or when its connection dies, so
// it needs no cleanup and cannot outlive a crashed holder. Two jobs on
// different entities run side by side.
//
// Use it where two different effects on one entity must not interleave
// (claims already keep one effect from running twice). It returns
// ErrInvalidKey for the zero key and the database error otherwise,
// including ctx's cancellation while waiting.
func LockEntityTx(ctx context.Context, tx pgx.Tx, entity Key) error {
	if entity.IsZero() {
		return fmt.Errorf("lock entity: %w: key is empty", ErrInvalidKey)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, entity.String()); err != nil {
		return fmt.Errorf("lock entity %s: %w", entity, err)
	}
	return nil
}
