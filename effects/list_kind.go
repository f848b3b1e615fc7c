package effects

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ListKind returns every record of kind created in [from, to), ordered by
// creation time and key, across tenants (for operator jobs such as
// reconciliation). On the partitioned table it reads only the leaves of
// the classes a record of kind may be in. It returns an error for an empty
// kind, an empty window or a failed query.
func (c *Client) ListKind(ctx context.Context, kind string, from, to time.Time) ([]*Record, error) {
	if kind == "" {
		return nil, errors.New("list effects by kind: kind is empty")
	}
	if !to.After(from) {
		return nil, fmt.Errorf("list %s effects: window end %s is not after its start %s",
			kind, to.Format(time.RFC3339Nano), from.Format(time.RFC3339Nano))
	}
	rows, err := c.db.Query(ctx, `SELECT `+recordColumns+` FROM keyed_effects
		WHERE kind = $1 AND class IN (`+kindClasses(kind)+`) AND created_at >= $2 AND created_at < $3
		ORDER BY created_at, key`, kind, from, to)
	if err != nil {
		return nil, fmt.Errorf("list %s effects: %w", kind, err)
	}
	defer rows.Close()
	var out []*Record
	for rows.Next() {
		rec, _, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("list %s effects: %w", kind, err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list %s effects: %w", kind, err)
	}
	return out, nil
}
