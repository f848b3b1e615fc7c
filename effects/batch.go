package effects

import "context"

// DeleteInBatches runs sql, a DELETE of at most batch rows, with args
// followed by batch as its last parameter, until a run deletes fewer than
// batch rows, so that pruning a large backlog never holds many row locks or
// one long transaction. It returns the rows deleted in all and, on error,
// what it had deleted so far with the database error.
func DeleteInBatches(ctx context.Context, db DB, batch int, sql string, args ...any) (int64, error) {
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
