package effects

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DoOpts configures Do. A nil *DoOpts means all defaults.
type DoOpts struct {
	// AtMostOnce is for irreversible sends whose provider has no
	// idempotency key. An earlier attempt that claimed the key and never
	// reported back may have sent, so Do does not call fn again: it records
	// the effect as failed terminally with code CodeAmbiguous and returns an
	// error wrapping ErrAmbiguous. Failures fn reported as Transient are
	// still retried, because those attempts are known not to have sent.
	AtMostOnce bool
	// ExtendEvery is how often Do renews the lease while fn runs. Zero means
	// a third of the lease.
	ExtendEvery time.Duration
	// Heartbeat, if set, is called after each successful lease renewal, for
	// example to record a Temporal activity heartbeat.
	Heartbeat func(ctx context.Context)
}

// Do runs fn as the keyed effect p.Key, exactly once across any number of
// calls with the same key, and returns its outcome.
//
// If the effect already succeeded, Do returns the stored outcome without
// calling fn. If fn runs, its context is cancelled with ErrLeaseLost should
// another owner take the claim over; while fn runs Do renews the lease. When
// fn succeeds its result is stored with Complete; when it fails the error is
// recorded with Fail (terminal unless marked Transient) and returned as it
// is. Errors from claiming are returned as Claim returns them: check
// ErrInProgress (retry later), ErrTerminal, ErrKeyReused and ErrAmbiguous
// with errors.Is, or call IsTransient.
//
// The result type T must survive a JSON round trip, because a replay decodes
// it from the record. Keep it to outcomes: IDs, statuses, amounts.
func Do[T any](ctx context.Context, c *Client, p ClaimParams, fn func(ctx context.Context, claim *Claim) (T, error), opts *DoOpts) (T, error) {
	var zero T
	if opts == nil {
		opts = &DoOpts{}
	}
	claim, err := c.Claim(ctx, p)
	if err != nil {
		return zero, err
	}
	if claim.Done {
		var out T
		return out, claim.Decode(&out)
	}
	bg := context.WithoutCancel(ctx)
	if opts.AtMostOnce && (claim.Mode == ModeReentry || claim.Mode == ModeTakeover) {
		amb := fmt.Errorf("%w: %s was claimed by an earlier attempt that never reported back; check the provider for this key",
			ErrAmbiguous, claim.Key)
		if ferr := c.Fail(bg, claim, NewCodedError(CodeAmbiguous, amb.Error())); ferr != nil {
			return zero, errors.Join(amb, ferr)
		}
		return zero, amb
	}

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := c.keepLease(runCtx, claim, p.Lease, opts, cancel)
	out, err := fn(runCtx, claim)
	stop()

	if cause := context.Cause(runCtx); errors.Is(cause, ErrLeaseLost) {
		return zero, fmt.Errorf("do %s: %w", claim.Key, cause)
	}
	if err != nil {
		if ferr := c.Fail(bg, claim, err); ferr != nil {
			return zero, errors.Join(err, ferr)
		}
		return zero, err
	}
	if err := c.Complete(bg, claim, out); err != nil {
		return zero, err
	}
	return out, nil
}

// keepLease renews claim's lease in the background until the returned stop
// function is called. A lost lease cancels the run with ErrLeaseLost.
func (c *Client) keepLease(ctx context.Context, claim *Claim, lease time.Duration, opts *DoOpts, cancel context.CancelCauseFunc) (stop func()) {
	if lease <= 0 {
		lease = c.lease
	}
	every := opts.ExtendEvery
	if every <= 0 {
		every = lease / 3
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			err := c.Extend(ctx, claim, lease)
			switch {
			case errors.Is(err, ErrLeaseLost):
				cancel(ErrLeaseLost)
				return
			case err != nil:
				c.logger.WarnContext(ctx, "extend effect lease", "effect_key", claim.Key.String(), "error", err)
			case opts.Heartbeat != nil:
				opts.Heartbeat(ctx)
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// DoTx runs fn as the keyed effect p.Key inside the caller's transaction:
// the claim, fn's database writes and the completed record commit or roll
// back together, so the effect and its record can never disagree. Racers for
// the same key wait for the transaction. If the effect already succeeded,
// DoTx returns the stored outcome without calling fn. When fn fails DoTx
// returns its error and records nothing: roll the transaction back.
func DoTx[T any](ctx context.Context, c *Client, tx pgx.Tx, p ClaimParams, fn func(ctx context.Context, tx pgx.Tx, claim *Claim) (T, error)) (T, error) {
	var zero T
	claim, err := c.ClaimTx(ctx, tx, p)
	if err != nil {
		return zero, err
	}
	if claim.Done {
		var out T
		return out, claim.Decode(&out)
	}
	out, err := fn(ctx, tx, claim)
	if err != nil {
		return zero, err
	}
	if err := c.CompleteTx(ctx, tx, claim, out); err != nil {
		return zero, err
	}
	return out, nil
}
