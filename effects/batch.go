package effects

import (
	"context"
	"fmt"
)

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

// OldestFirstSQL returns, for DeleteInBatches, a DELETE of at most $limit
// rows of table that meet cond, the oldest by orderBy first, by their row
// addresses: nothing is locked before the DELETE and no row is looked up
// again by key. cond is checked again on each row the DELETE reaches, so a
// row changed meanwhile goes only if it still meets it. On a partitioned
// table cond must name the partitions (row addresses are per partition).
func OldestFirstSQL(table, cond, orderBy string, limit int) string {
	return fmt.Sprintf(`DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM %[1]s WHERE %[2]s ORDER BY %[3]s LIMIT $%[4]d))
AND %[2]s`, table, cond, orderBy, limit)
}
