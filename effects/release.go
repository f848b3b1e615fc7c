package effects

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// Release deletes owner's claim on key, so the next claim is new at once.
// Call it only when the effect did not and will not happen (a rolled-back
// database effect); anything that may have reached a provider must Fail. It
// matches the owner, not a generation. It reports whether it deleted a claim,
// and returns an error for a zero key, an empty owner or a failed statement.
// It looks for the key in every leaf; ReleaseClaim looks in one.
func (c *Client) Release(ctx context.Context, key Key, owner string) (bool, error) {
	if key.IsZero() {
		return false, fmt.Errorf("release: %w: key is empty", ErrInvalidKey)
	}
	if owner == "" {
		return false, errors.New("release " + key.String() + ": owner is empty")
	}
	return c.release(ctx, key, owner, `DELETE FROM keyed_effects WHERE key = $1 AND owner = $2 AND state = 'claimed'`)
}

// ReleaseClaim is Release of a claim this client acquired, by its owner,
// in the record's own leaf: on the partitioned table the statement plans
// and locks one table, not every leaf of every class. A claim whose
// Complete ran in a transaction that rolled back is still released; a
// finished record never is. It returns an error for a claim that was not
// acquired and for a failed statement.
func (c *Client) ReleaseClaim(ctx context.Context, claim *Claim) (bool, error) {
	if claim == nil || claim.Mode == "" {
		return false, errors.New("release: the claim was not acquired")
	}
	return c.release(ctx, claim.Key, claim.Owner,
		`DELETE FROM `+claim.table()+` WHERE key = $1 AND owner = $2 AND state = 'claimed' AND created_at = $3`, claim.createdAt)
}

func (c *Client) release(ctx context.Context, key Key, owner, sql string, args ...any) (bool, error) {
	tag, err := c.db.Exec(ctx, sql, append([]any{key.String(), owner}, args...)...)
	if err != nil {
		return false, fmt.Errorf("release %s: %w", key, err)
	}
	released := tag.RowsAffected() == 1
	if released {
		c.logger.LogAttrs(ctx, slog.LevelInfo, "effect claim released",
			slog.String("effect_key", key.String()), slog.String("owner", owner))
	}
	return released, nil
}
