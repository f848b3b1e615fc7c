package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Resolution is what an operator decides about a stuck or failed effect.
type Resolution string

// The resolutions Resolve accepts.
const (
	// ResolveDone records that the effect did happen (for example the
	// provider's records show the email went out): later claims replay the
	// given outcome and never act.
	ResolveDone Resolution = "done"
	// ResolveRetry records that the effect did not happen: the record
	// becomes a transient failure, so the next claim acts again.
	ResolveRetry Resolution = "retry"
)

// CodeResolvedRetry is the error code ResolveRetry stores: the next claim
// takes the record with ModeRetry and Resolved set.
const CodeResolvedRetry = "resolved_retry"

// resolvedPrefix starts the error message Resolve stores with the reason.
const resolvedPrefix = "resolved by operator: "

// MaxReasonBytes is the longest reason Resolve accepts: the stored message,
// resolvedPrefix and the reason, fits the 512 bytes of a failure message.
const MaxReasonBytes = maxErrorMessage - len(resolvedPrefix)

// ErrNotResolvable means the record is in a state an operator may not
// overwrite: it succeeded, or it is claimed with a live lease.
var ErrNotResolvable = errors.New("effect record cannot be resolved in its state")

// ResolveParams says how to resolve an effect and why.
type ResolveParams struct {
	Resolution Resolution
	// Result is the outcome stored with ResolveDone; like Complete's, an
	// outcome and never a payload.
	Result any
	// Reason is kept on the record, for the next person who looks. Required.
	Reason string
}

// Resolve lets an operator settle a failed record or an expired claim:
// ResolveRetry makes the next run act again, ResolveDone replays an outcome.
// It bumps the generation, so a late owner gets ErrLeaseLost. It returns
// ErrNotResolvable for a live claim or a succeeded record, ErrNotFound for a
// missing one.
func (c *Client) Resolve(ctx context.Context, key Key, p ResolveParams) (*Record, error) {
	if key.IsZero() {
		return nil, fmt.Errorf("resolve: %w: key is empty", ErrInvalidKey)
	}
	reason := strings.TrimSpace(p.Reason)
	if reason == "" {
		return nil, fmt.Errorf("resolve %s: a reason is required", key)
	}
	if len(reason) > MaxReasonBytes {
		return nil, fmt.Errorf("resolve %s: reason is longer than %d bytes", key, MaxReasonBytes)
	}
	var (
		state  State
		result []byte
		code   any // NULL for done
		msg    = resolvedPrefix + reason
	)
	switch p.Resolution {
	case ResolveDone:
		state = StateSucceeded
		body, err := json.Marshal(p.Result)
		if err != nil {
			return nil, fmt.Errorf("resolve %s: encode result: %w", key, err)
		}
		if len(body) > MaxResultBytes {
			return nil, fmt.Errorf("resolve %s: %w", key, ErrResultTooLarge)
		}
		result = body
	case ResolveRetry:
		state, code = StateFailedTransient, CodeResolvedRetry
	default:
		return nil, fmt.Errorf("resolve %s: resolution %q is neither %q nor %q", key, p.Resolution, ResolveDone, ResolveRetry)
	}
	tag, err := c.db.Exec(ctx, `
UPDATE keyed_effects
SET state = $2, result = coalesce($3, result), error_code = $4, error_message = $5,
    generation = generation + 1, lease_until = NULL, finished_at = now(), updated_at = now()
WHERE key = $1
  AND (state IN ('failed_transient', 'failed_terminal') OR (state = 'claimed' AND lease_until <= now()))`,
		key.String(), state, result, code, msg)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", key, err)
	}
	if tag.RowsAffected() == 0 {
		rec, err := c.Get(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", key, err)
		}
		return rec, fmt.Errorf("resolve %s: %w: it is %s", key, ErrNotResolvable, describe(rec))
	}
	c.logger.InfoContext(ctx, "effect resolved by operator", "effect_key", key.String(), "resolution", string(p.Resolution), "reason", reason)
	return c.Get(ctx, key)
}

func describe(r *Record) string {
	if r.State == StateClaimed {
		return fmt.Sprintf("claimed by %q with a live lease", r.Owner)
	}
	return string(r.State)
}
