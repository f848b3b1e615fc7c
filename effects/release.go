package effects

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// ReleaseOpts configures Release. A nil *ReleaseOpts means all defaults.
type ReleaseOpts struct {
	// Kind is the kind the key was claimed under (ClaimParams.Kind): Release
	// then looks only in the leaves a record of that kind can be in. Empty
	// means the key's last part, the kind a claim gives it by default, and
	// a key not found there is looked for in every other leaf.
	Kind string
}

// Release deletes owner's claim on key, so the next claim is new at once.
// Call it only when the effect did not and will not happen (a rolled-back
// database effect); anything that may have reached a provider must Fail. It
// matches the owner, not a generation. It reports whether it deleted a claim,
// and returns an error for a zero key, an empty owner or a failed statement.
// ReleaseClaim, given the claim, looks in one leaf.
func (c *Client) Release(ctx context.Context, key Key, owner string, opts *ReleaseOpts) (bool, error) {
	if key.IsZero() {
		return false, fmt.Errorf("release: %w: key is empty", ErrInvalidKey)
	}
	if owner == "" {
		return false, errors.New("release " + key.String() + ": owner is empty")
	}
	const sql = `DELETE FROM keyed_effects WHERE key = $1 AND owner = $2 AND state = 'claimed' AND class `
	kind := ""
	if opts != nil {
		kind = opts.Kind
	}
	if kind != "" {
		return c.release(ctx, key, owner, sql+`IN (`+kindClasses(kind)+`)`)
	}
	parts := key.Parts()
	classes := kindClasses(parts[len(parts)-1])
	released, err := c.release(ctx, key, owner, sql+`IN (`+classes+`)`)
	if released || err != nil {
		return released, err
	}
	return c.release(ctx, key, owner, sql+`NOT IN (`+classes+`)`)
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
