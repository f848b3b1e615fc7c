package refund

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// Reserve appends the refund to the order's ledger, once, if what is left of
// the charge covers it.
// Effect class: absolute write (a ledger append under the order's lock, in
// one transaction with the claim); fingerprint: amount and reason.
// Errors: InvalidInput, OrderNotFound, InvalidState (not paid, more than is
// left, or refunds.MaxPerOrder refunds already: nothing written) and
// KeyReused are terminal; Transient and InProgress retry.
func (a *Activities) Reserve(ctx context.Context, in refunds.RefundInput) (refunds.ReserveResult, error) {
	return DeclReserve.Run(ctx, a.run, in, effect[refunds.ReserveResult]{
		Fingerprint: func(*call) []string { return []string{strconv.FormatInt(in.AmountMinor, 10), in.Reason} },
		Do:          a.reserveTx,
		// A refused refund is refused for good (a new refund ID asks
		// again): its failed record shows it and answers a repeat.
		RecordRefusal: true,
	})
}

// reserveTx checks the order and appends the refund to its ledger in c.Tx.
func (a *Activities) reserveTx(ctx context.Context, c *call) (refunds.ReserveResult, error) {
	o, err := a.orders.GetTx(ctx, c.Tx, c.In.TenantID, c.In.OrderID)
	if err != nil {
		return refunds.ReserveResult{}, fmt.Errorf("reserve %s: load order: %w", c.Key, err)
	}
	// A refunded order passes: its ledger has nothing left, so ReserveTx
	// refuses a new refund and finds a repeat's own row.
	if !o.Status.WasPaid() {
		return refunds.ReserveResult{}, c.Fail(step.ErrTypeInvalidState, "order is %s, not paid: nothing to refund", o.Status)
	}
	e := refunds.Entry{TenantID: c.In.TenantID, OrderID: c.In.OrderID, RefundID: c.In.RefundID,
		AmountMinor: c.In.AmountMinor, Reason: c.In.Reason, EffectKey: c.Key.String()}
	refunded, err := a.ledger.ReserveTx(ctx, c.Tx, e, o.AmountMinor)
	var exceeds *refunds.ExceedsError
	switch {
	case errors.As(err, &exceeds):
		return refunds.ReserveResult{}, c.Fail(step.ErrTypeInvalidState, "refund of %s exceeds what is left of the charge: %s charged, %s refunded or in flight, %s left",
			orders.FormatAmount(exceeds.AmountMinor, o.Currency), orders.FormatAmount(exceeds.ChargedMinor, o.Currency),
			orders.FormatAmount(exceeds.RefundedMinor, o.Currency),
			orders.FormatAmount(exceeds.ChargedMinor-exceeds.RefundedMinor, o.Currency))
	case errors.Is(err, refunds.ErrTooManyRefunds):
		return refunds.ReserveResult{}, c.Fail(step.ErrTypeInvalidState, "order has %d refunds, the most one order may have", refunds.MaxPerOrder)
	case errors.Is(err, refunds.ErrConflict):
		return refunds.ReserveResult{}, c.Fail(step.ErrTypeKeyReused, "refund %s is in the ledger with another amount or reason", c.In.RefundID)
	case err != nil:
		return refunds.ReserveResult{}, fmt.Errorf("reserve %s: %w", c.Key, err)
	}
	return refunds.ReserveResult{AmountMinor: e.AmountMinor, Currency: o.Currency, RefundedMinor: refunded, ChargedMinor: o.AmountMinor}, nil
}
