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

// Do runs fn as the keyed effect p.Key, once across any number of calls with
// the same key, and returns its outcome; a stored outcome is returned without
// calling fn. While fn runs Do renews the lease, and cancels fn's context with
// ErrLeaseLost if another owner takes the claim. fn's error is recorded with
// Fail and returned as is; claim errors are returned as Claim returns them.
// T must survive a JSON round trip. It refuses p.AsyncCommit with
// opts.AtMostOnce.
func Do[T any](ctx context.Context, c *Client, p ClaimParams, fn func(ctx context.Context, claim *Claim) (T, error), opts *DoOpts) (T, error) {
	var zero T
	if opts == nil {
		opts = &DoOpts{}
	}
	if opts.AtMostOnce && p.AsyncCommit {
		return zero, fmt.Errorf("do %s: AsyncCommit with AtMostOnce: a claim lost in a crash would let a later attempt act again", p.Key)
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

// DoTx runs fn as the keyed effect p.Key inside tx: the claim, fn's writes and
// the completed record commit or roll back together. A stored outcome is
// returned without calling fn. When fn fails DoTx records nothing and returns
// its error: roll tx back.
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
