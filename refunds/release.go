package refunds

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// ErrRefunded means Stripe's refund of the refund is recorded: its
// reservation holds money that went out and cannot be released.
var ErrRefunded = errors.New("refund was made at Stripe")

// ReleaseRefund gives back what the refund reserved, once, after Stripe
// refused the refund for good.
//
// Effect class: absolute write, made of an append to refund_releases. In
// one Postgres transaction (effects.DoTx) it claims the effect key
// ("…:refund_release"), reads the refund_stripe step's record, which must
// have failed with ProviderRejected (or not exist: Stripe refused before
// the step claimed its key), takes the order's lock, checks that Stripe's
// refund is not recorded, appends the whole of the refund's ledger amount
// with Stripe's refusal code (such as "charge_disputed", read from the
// step's stored failure), moves an order marked partially_refunded or
// refunded to the status its refunds confirmed by Stripe say (as
// MarkRefunded decides it; the released refund was never confirmed, so this
// only corrects a status an earlier keyed set from reservations) and
// completes the record, so that all of it commits or none does. Nothing is
// ever subtracted from refund_ledger: what the order's refunds hold of its
// charge becomes its ledger's sum minus its releases'.
// A second run returns the stored ReleaseResult; one whose record was
// pruned finds its own release and adds nothing. RefundWorkflow runs it
// only after RefundAtStripe failed with ProviderRejected.
//
// Errors (through step.ToTemporal): InvalidInput and InvalidState
// (the refund is not in the ledger, Stripe's refund is recorded, or the
// refund_stripe step did not fail with Stripe's refusal: nothing is
// written) are non-retryable; Transient and InProgress are retryable.
func (a *Activities) ReleaseRefund(ctx context.Context, in RefundInput) (ReleaseResult, error) {
	return DeclRelease.Run(ctx, a.run, in, effect[ReleaseResult]{Do: a.releaseTx, RecordRefusal: true})
}

// releaseTx checks that Stripe refused the refund and releases it in c.Tx.
func (a *Activities) releaseTx(ctx context.Context, c *call) (ReleaseResult, error) {
	code, err := a.refusal(ctx, c)
	if err != nil {
		return ReleaseResult{}, err
	}
	rel := Release{TenantID: c.In.TenantID, OrderID: c.In.OrderID, RefundID: c.In.RefundID, Code: code, EffectKey: c.Key.String()}
	got, refunded, err := a.ledger.ReleaseTx(ctx, c.Tx, rel)
	switch {
	case errors.Is(err, ErrNotFound):
		return ReleaseResult{}, c.Fail(step.ErrTypeInvalidState, "refund %s is not in the ledger: nothing to release", c.In.RefundID)
	case errors.Is(err, ErrRefunded):
		return ReleaseResult{}, c.Fail(step.ErrTypeInvalidState, "Stripe's refund of %s is recorded: its reservation holds money that went out", c.In.RefundID)
	case err != nil:
		return ReleaseResult{}, fmt.Errorf("release %s: %w", c.Key, err)
	}
	if err := a.settleTx(ctx, c); err != nil {
		return ReleaseResult{}, err
	}
	return ReleaseResult{AmountMinor: got.AmountMinor, Code: got.Code, RefundedMinor: refunded}, nil
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
	key, err := c.In.EffectKey(StepStripe)
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

// ReleaseTx appends r to refund_releases inside tx, for the whole amount
// of r's refund in the ledger, and returns the release as stored and what
// the order's refunds hold of its charge after it (ReservedTx: ledger minus
// releases). It first takes
// the order's lock (effects.LockEntityTx), as ReserveTx does. A refund
// already released is not released again: the stored release comes back.
//
// It returns an error wrapping ErrNotFound when the refund is not in the
// ledger, ErrRefunded when its Stripe refund is recorded, and database
// errors, wrapped.
func (l *Ledger) ReleaseTx(ctx context.Context, tx pgx.Tx, r Release) (Release, int64, error) {
	orderKey, err := orders.OrderKey(r.TenantID, r.OrderID)
	if err != nil {
		return Release{}, 0, err
	}
	if err := effects.LockEntityTx(ctx, tx, orderKey); err != nil {
		return Release{}, 0, err
	}
	stored, err := released(ctx, tx, r.TenantID, r.OrderID, r.RefundID)
	if err != nil || stored != nil {
		return l.withRefunded(ctx, tx, stored, err)
	}
	e, err := l.GetTx(ctx, tx, r.TenantID, r.OrderID, r.RefundID)
	if err != nil {
		return Release{}, 0, err
	}
	if _, found, err := l.stripeOutcome(ctx, tx, r.TenantID, r.OrderID, r.RefundID); err != nil || found {
		if err == nil {
			err = fmt.Errorf("release refund %s of order %s/%s: %w", r.RefundID, r.TenantID, r.OrderID, ErrRefunded)
		}
		return Release{}, 0, err
	}
	r.AmountMinor = e.AmountMinor
	err = tx.QueryRow(ctx, `
INSERT INTO refund_releases (tenant_id, order_id, refund_id, amount_minor, code, effect_key)
VALUES ($1, $2, $3, $4, $5, $6) RETURNING created_at`, r.TenantID, r.OrderID, r.RefundID, r.AmountMinor, r.Code, r.EffectKey).Scan(&r.CreatedAt)
	if err != nil {
		return Release{}, 0, fmt.Errorf("release refund %s of order %s/%s: %w", r.RefundID, r.TenantID, r.OrderID, err)
	}
	return l.withRefunded(ctx, tx, &r, nil)
}

// withRefunded returns *r with what r's order has refunded, or err.
func (l *Ledger) withRefunded(ctx context.Context, tx pgx.Tx, r *Release, err error) (Release, int64, error) {
	if err != nil {
		return Release{}, 0, err
	}
	refunded, err := l.ReservedTx(ctx, tx, r.TenantID, r.OrderID)
	return *r, refunded, err
}

// Released returns the release of the order's refund refundID, or nil when
// it was not released. It returns the database error, wrapped.
func (l *Ledger) Released(ctx context.Context, tenantID, orderID, refundID string) (*Release, error) {
	return released(ctx, l.db, tenantID, orderID, refundID)
}

func released(ctx context.Context, db effects.DB, tenantID, orderID, refundID string) (*Release, error) {
	r := Release{TenantID: tenantID, OrderID: orderID, RefundID: refundID}
	err := db.QueryRow(ctx, `SELECT amount_minor, code, effect_key, created_at FROM refund_releases
WHERE tenant_id = $1 AND order_id = $2 AND refund_id = $3`, tenantID, orderID, refundID).Scan(&r.AmountMinor, &r.Code, &r.EffectKey, &r.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read release of refund %s of order %s/%s: %w", refundID, tenantID, orderID, err)
	}
	return &r, nil
}
