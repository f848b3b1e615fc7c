package effects

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// Release gives up owner's claim on key by deleting its record, so that the
// next claim of key is new (ModeNew, with any fingerprint) at once instead of
// waiting for the lease to run out or finding a stored failure. Call it only
// when the effect did not happen and will not: a database effect whose
// transaction rolled back, such as an HTTP request that failed and wrote
// nothing. Anything that may have reached a provider must be recorded with
// Fail instead.
//
// Release matches the owner, not a generation, so it also frees a claim
// whose acquisition committed while its caller saw an error (a reply lost to
// a timeout); it is meant for owners unique to one attempt. Complete, Fail
// and Extend match the owner too, so a handle on a released claim never
// touches a later claim of the same key by another owner.
//
// It reports whether it deleted a claim: false when key has no record, or a
// record that is finished or claimed by another owner. It returns an error
// for a zero key, an empty owner or a failed statement.
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
