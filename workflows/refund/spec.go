package refund

import (
	"context"

	"go.temporal.io/sdk/client"

	steps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// Pipeline returns the refund pipeline's registration.
func Pipeline() pipeline.Spec {
	return pipeline.Spec{
		Name:        "refund",
		Workflow:    refunds.WorkflowName,
		Register:    Register,
		Steps:       steps.Declarations(),
		LongestPath: steps.LongestPath(),
		Activities: func(d pipeline.Deps) ([]step.Definition, error) {
			a, err := steps.New(d)
			if err != nil {
				return nil, err
			}
			return a.Definitions(), nil
		},
		Placeholder:      refunds.NewInput("{tenant}", "{order}", "{refund_id}", 0, ""),
		RunOfKey:         refunds.WorkflowIDOfKey,
		Configure:        configure,
		SearchAttributes: []pipeline.SearchAttribute{{Name: orders.SearchAttrOrderID, Type: "Keyword"}},
		Final:            final,
	}
}

// configure gives a refund run started from the outbox what StartOptions
// gives it, with the amount in the summary when the row's Meta carries the
// currency: "refund r1 of order 9f3a · 5.00 USD". A payload that does not
// decode is an error wrapping outbox.ErrInvalid.
func configure(_ context.Context, _ effects.DB, req outbox.Request, o *client.StartWorkflowOptions) error {
	in, currency, err := refunds.FromStartRequest(req)
	if err != nil {
		return err
	}
	so := StartOptions(in, o.TaskQueue)
	o.TypedSearchAttributes, o.StaticSummary, o.Priority = so.TypedSearchAttributes, so.StaticSummary, so.Priority
	if currency != "" {
		o.StaticSummary += " · " + orders.FormatAmount(in.AmountMinor, currency)
	}
	return nil
}

// final reports whether the failed refund run workflowID was refused for
// good: its reservation was released after Stripe's refusal, or Reserve
// refused it (more than is left, an unpaid order).
func final(ctx context.Context, db effects.DB, workflowID string) bool {
	in, ok := refunds.ParseWorkflowID(workflowID)
	if !ok || db == nil {
		return false
	}
	ledger, err := refunds.NewLedger(db)
	if err != nil {
		return false
	}
	if rel, err := ledger.Released(ctx, in.TenantID, in.OrderID, in.RefundID); err == nil && rel != nil {
		return true
	}
	claims, err := effects.NewClient(db, nil)
	if err != nil {
		return false
	}
	key, err := in.EffectKey(refunds.StepReserve)
	if err != nil {
		return false
	}
	rec, err := claims.Get(ctx, key)
	return err == nil && rec.State == effects.StateFailedTerminal && step.RefusedForGood(rec.ErrorCode)
}
