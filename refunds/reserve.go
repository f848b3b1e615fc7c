package refunds

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// Reserve appends the refund to the order's ledger, once, if what is left
// of the charge covers it.
//
// Effect class: absolute write, made of a ledger append. In one Postgres
// transaction (effects.DoTx) it claims the effect key ("…:refund_reserve"),
// takes the order's lock (effects.LockEntityTx), sums the order's ledger,
// checks that the order's amount minus that sum covers the refund, appends
// the ledger row under its unique (tenant, order, refund) and completes the
// record, so that all of it commits or none does. Two concurrent refunds of
// one order are summed one after the other: together they never exceed the
// charge. A second run returns the stored ReserveResult; one whose record
// was pruned finds its own ledger row and adds nothing. The claim's
// fingerprint is the amount and reason.
//
// Errors (through step.ToTemporal): InvalidInput, OrderNotFound,
// InvalidState (the order is not paid, or the refund exceeds what is left
// of the charge: nothing is written and Stripe is never called) and
// KeyReused (the refund ID came back with another amount or reason) are
// non-retryable; Transient (a lost connection, a lock or serialization
// failure) and InProgress are retryable.
func (a *Activities) Reserve(ctx context.Context, in RefundInput) (ReserveResult, error) {
	return DeclReserve.Run(ctx, a.run, in, effect[ReserveResult]{
		Fingerprint: func(*call) []string { return []string{strconv.FormatInt(in.AmountMinor, 10), in.Reason} },
		Do:          a.reserveTx,
		// A refused refund is refused for good (a new refund ID asks
		// again): its failed record shows it and answers a repeat.
		RecordRefusal: true,
	})
}

// reserveTx checks the order and appends the refund to its ledger in c.Tx.
func (a *Activities) reserveTx(ctx context.Context, c *call) (ReserveResult, error) {
	o, err := a.orders.GetTx(ctx, c.Tx, c.In.TenantID, c.In.OrderID)
	if err != nil {
		return ReserveResult{}, fmt.Errorf("reserve %s: load order: %w", c.Key, err)
	}
	// A refunded order passes: its ledger has nothing left, so ReserveTx
	// refuses a new refund and finds a repeat's own row.
	if !o.Status.WasPaid() {
		return ReserveResult{}, c.Fail(step.ErrTypeInvalidState, "order is %s, not paid: nothing to refund", o.Status)
	}
	e := Entry{TenantID: c.In.TenantID, OrderID: c.In.OrderID, RefundID: c.In.RefundID,
		AmountMinor: c.In.AmountMinor, Reason: c.In.Reason, EffectKey: c.Key.String()}
	refunded, err := a.ledger.ReserveTx(ctx, c.Tx, e, o.AmountMinor)
	var exceeds *ExceedsError
	switch {
	case errors.As(err, &exceeds):
		return ReserveResult{}, c.Fail(step.ErrTypeInvalidState, "refund of %s exceeds what is left of the charge: %s charged, %s refunded or in flight, %s left",
			orders.FormatAmount(exceeds.AmountMinor, o.Currency), orders.FormatAmount(exceeds.ChargedMinor, o.Currency),
			orders.FormatAmount(exceeds.RefundedMinor, o.Currency),
			orders.FormatAmount(exceeds.ChargedMinor-exceeds.RefundedMinor, o.Currency))
	case errors.Is(err, ErrConflict):
		return ReserveResult{}, c.Fail(step.ErrTypeKeyReused, "refund %s is in the ledger with another amount or reason", c.In.RefundID)
	case err != nil:
		return ReserveResult{}, fmt.Errorf("reserve %s: %w", c.Key, err)
	}
	return ReserveResult{AmountMinor: e.AmountMinor, Currency: o.Currency, RefundedMinor: refunded, ChargedMinor: o.AmountMinor}, nil
}
