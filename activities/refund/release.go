package refund

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// ReleaseRefund gives back what the refund reserved, once, after Stripe
// refused it for good: it appends the amount and Stripe's code to
// refund_releases and corrects a status set from reservations.
// Effect class: absolute write (an append under the order's lock, in one
// transaction with the claim).
// Errors: InvalidInput and InvalidState (no ledger row, a recorded Stripe
// refund, or no refusal) are terminal; Transient and InProgress retry.
func (a *Activities) ReleaseRefund(ctx context.Context, in refunds.RefundInput) (refunds.ReleaseResult, error) {
	return DeclRelease.Run(ctx, a.run, in, effect[refunds.ReleaseResult]{Do: a.releaseTx, RecordRefusal: true})
}

// releaseTx checks that Stripe refused the refund and releases it in c.Tx.
func (a *Activities) releaseTx(ctx context.Context, c *call) (refunds.ReleaseResult, error) {
	code, err := a.refusal(ctx, c)
	if err != nil {
		return refunds.ReleaseResult{}, err
	}
	rel := refunds.Release{TenantID: c.In.TenantID, OrderID: c.In.OrderID, RefundID: c.In.RefundID, Code: code, EffectKey: c.Key.String()}
	got, refunded, err := a.ledger.ReleaseTx(ctx, c.Tx, rel)
	switch {
	case errors.Is(err, refunds.ErrNotFound):
		return refunds.ReleaseResult{}, c.Fail(step.ErrTypeInvalidState, "refund %s is not in the ledger: nothing to release", c.In.RefundID)
	case errors.Is(err, refunds.ErrRefunded):
		return refunds.ReleaseResult{}, c.Fail(step.ErrTypeInvalidState, "Stripe's refund of %s is recorded: its reservation holds money that went out", c.In.RefundID)
	case err != nil:
		return refunds.ReleaseResult{}, fmt.Errorf("release %s: %w", c.Key, err)
	}
	if err := a.settleTx(ctx, c); err != nil {
		return refunds.ReleaseResult{}, err
	}
	return refunds.ReleaseResult{AmountMinor: got.AmountMinor, Code: got.Code, RefundedMinor: refunded}, nil
}

// settleTx moves an order a refund marked (partially_refunded or refunded)
// to the status its confirmed refunds say, in c.Tx under the order's lock,
// with c's effect key as the transition's event ID. A released refund was
// never confirmed, so this changes nothing unless the status counted it:
// an earlier keyed marked orders from reservations.
func (a *Activities) settleTx(ctx context.Context, c *call) error {
	o, err := a.orders.GetTx(ctx, c.Tx, c.In.TenantID, c.In.OrderID)
	if err != nil {
		return fmt.Errorf("release %s: load order: %w", c.Key, err)
	}
	if o.Status != orders.StatusPartiallyRefunded && o.Status != orders.StatusRefunded {
		return nil
	}
	to, err := a.confirmedStatus(ctx, c.Tx, o)
	if err != nil || to == o.Status {
		return err
	}
	if _, err := a.orders.TransitionTx(ctx, c.Tx, o.TenantID, o.ID, o.Status, to, c.Key.String()); err != nil {
		return fmt.Errorf("release %s: %w", c.Key, err)
	}
	c.Log.InfoContext(ctx, "order status corrected to its confirmed refunds", "from", string(o.Status), "to", string(to))
	return nil
}

// providerRejected is the code a record of a ProviderRejected failure
// stores.
var providerRejected = step.CodeProviderRejected

// refusal returns Stripe's refusal code from the refund_stripe step's
// record, read in c.Tx, or an InvalidState error when that step did not
// fail with Stripe's refusal.
func (a *Activities) refusal(ctx context.Context, c *call) (string, error) {
	key, err := c.In.EffectKey(refunds.StepStripe)
	if err != nil {
		return "", err
	}
	rec, err := a.claims.GetTx(ctx, c.Tx, key)
	switch {
	case errors.Is(err, effects.ErrNotFound):
		return providerRejected, nil // refused before the step claimed its key
	case err != nil:
		return "", fmt.Errorf("release %s: read %s: %w", c.Key, key, err)
	case rec.State != effects.StateFailedTerminal || rec.ErrorCode != providerRejected:
		return "", c.Fail(step.ErrTypeInvalidState, "the refund_stripe step is %s (%s), not refused by Stripe: nothing to release",
			rec.State, rec.ErrorCode)
	}
	return RefusalCode(rec.ErrorMessage), nil
}

// refundStatusRE finds RefundAtStripe's message for a refund Stripe made
// and then failed or canceled.
var refundStatusRE = regexp.MustCompile(`Stripe refund \S+ is (failed|canceled)\b`)

// RefusalCode returns Stripe's code in msg, the stored message of a
// RefundAtStripe refusal: the error code of Stripe's answer (such as
// "charge_disputed" in "status 400 invalid_request_error/charge_disputed"),
// "refund_failed" or "refund_canceled" for a refund Stripe made and then
// failed or canceled, and "provider_rejected" when msg names neither.
func RefusalCode(msg string) string {
	if code := stripestep.Code(msg); code != "" {
		return code
	}
	if m := refundStatusRE.FindStringSubmatch(msg); m != nil {
		return "refund_" + m[1]
	}
	return providerRejected
}
