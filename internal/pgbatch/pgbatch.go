// Package pgbatch deletes old rows in bounded batches, so that pruning a
// large backlog never holds many row locks or one long transaction.
package pgbatch

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer is what Delete needs: *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Delete runs sql, a DELETE of at most batch rows, with args followed by
// batch as its last parameter, until a run deletes fewer than batch rows.
// It returns the rows deleted in all, and on error what it had deleted so
// far together with the database error.
func Delete(ctx context.Context, db Execer, batch int, sql string, args ...any) (int64, error) {
	args = append(args, batch)
	var total int64
	for {
		tag, err := db.Exec(ctx, sql, args...)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}
