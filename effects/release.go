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
func (c *Client) Release(ctx context.Context, key Key, owner string) (bool, error) {
	if key.IsZero() {
		return false, fmt.Errorf("release: %w: key is empty", ErrInvalidKey)
	}
	if owner == "" {
		return false, errors.New("release " + key.String() + ": owner is empty")
	}
	tag, err := c.db.Exec(ctx, `DELETE FROM keyed_effects WHERE key = $1 AND owner = $2 AND state = 'claimed'`,
		key.String(), owner)
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
