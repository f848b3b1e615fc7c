// Package order holds the order pipeline's workflow, OrderWorkflow (charge,
// mark paid, send receipt; mark failed after a decline), its start options
// and its registration, Pipeline.
package order

import (
	"errors"
	"fmt"
	"slices"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	steps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

// Register registers OrderWorkflow with r under orders.WorkflowName,
// configured by opts (nil: defaults).
func Register(r worker.WorkflowRegistry, opts *pipeline.Opts) {
	r.RegisterWorkflowWithOptions(func(ctx workflow.Context, in orders.OrderInput) (orders.OrderResult, error) {
		out, o, err := run(ctx, in, opts)
		if err == nil {
			o.ShowDetails(ctx)
		}
		return out, err
	}, workflow.RegisterOptions{Name: orders.WorkflowName})
}

// markFailedChange is the workflow.GetVersion change ID of marking the
// order failed after a terminal charge failure.
const markFailedChange = "mark-failed-on-decline"

// shown lists the steps the status query shows from the start; MarkFailed
// joins them only when it runs.
var shown = []step.Declaration{steps.DeclCharge.Declaration, steps.DeclMarkPaid.Declaration, steps.DeclSendReceipt.Declaration}

// run is OrderWorkflow: it charges the order, marks it paid and sends the
// receipt through a pipeline.Run, and after a charge that failed for good
// marks the order failed and fails with the charge's error. It returns the
// Run for a caller that adds steps after the receipt, and a non-retryable
// InvalidInput error for an input it cannot use.
func run(ctx workflow.Context, in orders.OrderInput, opts *pipeline.Opts) (orders.OrderResult, *pipeline.Run, error) {
	var out orders.OrderResult
	if err := in.Validate(); err != nil {
		return out, nil, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("order workflow %s/%s: %v", in.TenantID, in.OrderID, err), step.ErrTypeInvalidInput, nil)
	}
	o, err := pipeline.New(ctx, in, shown, opts)
	if err != nil {
		return out, nil, err
	}
	// Beside each step, the run's details show the ID of its outcome.
	intentID := func(r orders.ChargeResult) string { return r.PaymentIntentID }
	paid := func(r orders.MarkPaidResult) string { return r.Status }
	messageID := func(r orders.ReceiptResult) string { return r.MessageID }
	if err := pipeline.RunStep(ctx, o, steps.DeclCharge.Declaration, &out.Charge, intentID); err != nil {
		if chargeFailedForGood(err) && workflow.GetVersion(ctx, markFailedChange, workflow.DefaultVersion, 1) >= 1 {
			markFailed(ctx, o)
		}
		return out, o, err
	}
	if err := pipeline.RunStep(ctx, o, steps.DeclMarkPaid.Declaration, &out.Paid, paid); err != nil {
		return out, o, err
	}
	if err := pipeline.RunStep(ctx, o, steps.DeclSendReceipt.Declaration, &out.Receipt, messageID); err != nil {
		return out, o, err
	}
	return out, o, nil
}

// markFailed runs the mark_failed step; the charge's error stays the run's
// outcome whether or not it succeeds.
func markFailed(ctx workflow.Context, o *pipeline.Run) {
	d := steps.DeclMarkFailed.Declaration
	if _, err := o.Index(d); err != nil { // Only a tenant and order ID near the key limit.
		workflow.GetLogger(ctx).Error("cannot mark the order failed", "error", err.Error())
		return
	}
	var failed orders.MarkFailedResult
	if err := pipeline.RunStep(ctx, o, d, &failed, func(r orders.MarkFailedResult) string { return r.Status }); err != nil {
		workflow.GetLogger(ctx).Warn("the order stays pending", "step", d.Step, "error", err.Error())
	}
	o.ShowDetails(ctx)
}

// chargeFailedForGood reports whether err, the charge's error, means the
// charge failed for good, so that the order is marked failed: a terminal
// type, except those that leave open whether the card was charged
// (KeyReused, Ambiguous, a DecisionTimeout) or leave nothing to mark (no
// order, a bad input).
func chargeFailedForGood(err error) bool {
	var app *temporal.ApplicationError
	if !errors.As(err, &app) {
		return false
	}
	switch app.Type() {
	case step.ErrTypeNotFound, step.ErrTypeInvalidInput, step.ErrTypeKeyReused, step.ErrTypeAmbiguous,
		pipeline.ErrTypeDecisionTimeout:
		return false
	}
	return app.NonRetryable() || slices.Contains(step.NonRetryableErrorTypes(), app.Type())
}
