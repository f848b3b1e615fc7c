package effects

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// LockEntityTx takes a transaction-scoped Postgres advisory lock on entity's
// key, waiting while another transaction holds it; it goes with tx's commit,
// rollback or dead connection. Use it where two different effects on one
// entity must not interleave. It returns ErrInvalidKey for the zero key and
// the database error otherwise, including ctx's cancellation.
func LockEntityTx(ctx context.Context, tx pgx.Tx, entity Key) error {
	if entity.IsZero() {
		return fmt.Errorf("lock entity: %w: key is empty", ErrInvalidKey)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, entity.String()); err != nil {
		return fmt.Errorf("lock entity %s: %w", entity, err)
	}
	return nil
}
