package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/idempotency"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
)

// DefaultMaxWait is the longest Prefer: wait the API honours (HandlerOpts.MaxWait).
const DefaultMaxWait = 10 * time.Second

// awaitUpdateID is the ID of the await update every request sends a run, so
// that concurrent requests for one run share one update and one outcome.
const awaitUpdateID = "keyed-api-await"

// The steps that decide a request: a Prefer: wait answer waits until those
// the run reached have settled.
var (
	orderDecidingSteps  = []string{orders.StepCharge, orders.StepMarkPaid, orders.StepMarkFailed}
	refundDecidingSteps = []string{refunds.StepReserve, refunds.StepStripe, refunds.StepMark, refunds.StepRelease}
)

// Charge states in ChargeView.
const (
	ChargeSucceeded      = "succeeded"
	ChargeDeclined       = "declined"
	ChargeNeedsAttention = "needs_attention"
	ChargePending        = "pending"
)

// ChargeView is the charge's outcome in an answer that waited (Prefer:
// wait): succeeded with Stripe's PaymentIntent ID, declined with the
// step's error code, needs_attention (its outcome is unknown; an operator
// decides), or pending (not settled within the wait).
type ChargeView struct {
	State           string `json:"state"`
	PaymentIntentID string `json:"payment_intent_id,omitempty"`
	ErrorCode       string `json:"error_code,omitempty"`
}

// chargeViewOf is the ChargeView of the charge's effect record, nil for
// none yet.
func chargeViewOf(rec *effects.Record) *ChargeView {
	if rec == nil {
		return &ChargeView{State: ChargePending}
	}
	v := effectView(rec)
	switch rec.State {
	case effects.StateSucceeded:
		var out struct {
			PaymentIntentID string `json:"payment_intent_id"`
		}
		_ = json.Unmarshal(rec.Result, &out) // an outcome without it shows none
		return &ChargeView{State: ChargeSucceeded, PaymentIntentID: out.PaymentIntentID}
	case effects.StateFailedTerminal:
		if unknownOutcome(v.ErrorCode) {
			return &ChargeView{State: ChargeNeedsAttention, ErrorCode: v.ErrorCode}
		}
		return &ChargeView{State: ChargeDeclined, ErrorCode: v.ErrorCode}
	}
	return &ChargeView{State: ChargePending}
}

// preferredWait returns the wait r prefers, when the Handler can start runs
// (HandlerOpts.Starter) and it is positive.
func (h *Handler) preferredWait(r *http.Request) (time.Duration, bool) {
	if h.starter == nil {
		return 0, false
	}
	d, ok := idempotency.PreferredWait(r, h.maxWait)
	return d, ok && d > 0
}

// awaitRun starts req's run, or joins the run going (the relay's, or a
// concurrent request's), with Update-with-Start, and waits up to wait for
// steps to settle. A run it started is marked sent in the outbox, so no
// relay starts it again; one the relay started first is simply joined. Any
// failure (Temporal unreachable, the wait over, the run closed) is logged
// at debug level: the answer is then read from the database as it stands,
// and the relay starts whatever was not started.
func (h *Handler) awaitRun(ctx context.Context, req outbox.Request, steps []string, wait time.Duration) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait)
	defer cancel()
	handle, err := h.starter.UpdateWithStart(wctx, req, client.UpdateWorkflowOptions{UpdateID: awaitUpdateID,
		UpdateName: pipeline.UpdateAwaitSteps, Args: []any{pipeline.AwaitSteps{Steps: steps}},
		WaitForStage: client.WorkflowUpdateStageCompleted})
	if err == nil {
		if runID := handle.RunID(); runID != "" {
			mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), h.timeout)
			if _, merr := outbox.MarkStarted(mctx, h.db, req.WorkflowID, runID); merr != nil {
				h.logger.WarnContext(ctx, "mark started run sent; the relay's start collapses into it", "workflow_id", req.WorkflowID, "error", merr)
			}
			mcancel()
		}
		var out []pipeline.StepStatus
		err = handle.Get(wctx, &out)
	}
	if err != nil {
		h.logger.DebugContext(ctx, "prefer wait: answering with the state as it stands", "workflow_id", req.WorkflowID, "error", err)
	}
}

// setWaited marks resp as an answer that waited: a Location to poll, and
// Preference-Applied (not stored: a replay did not wait).
func setWaited(w http.ResponseWriter, resp *idempotency.Response, location string, wait time.Duration) {
	resp.Header = http.Header{"Location": {location}}
	w.Header().Set(idempotency.HeaderPreferenceApplied, "wait="+strconv.Itoa(int(wait/time.Second)))
}

// createOrderWaiting is POST /v1/orders with Prefer: wait: it commits the
// order and its start (the outbox row) first, as without the preference,
// holding the key (Keep); then it starts or joins the run and waits up to
// wait for the charge to settle; then it stores and sends the answer as
// the database has it: 201 (200 for an existing order) once paid or
// declined, else 202 pending, each with Location.
func (h *Handler) createOrderWaiting(w http.ResponseWriter, r *http.Request, q *idempotency.Request, tenant string, no orders.NewOrder, wait time.Duration) {
	ctx := r.Context()
	var order *orders.Order
	var created bool
	err := pgx.BeginFunc(ctx, h.db, func(tx pgx.Tx) error {
		var err error
		order, created, err = h.store.CreateAndEnqueueTx(ctx, tx, no)
		return err
	})
	switch {
	case errors.Is(err, orders.ErrConflict):
		writeError(w, newError(http.StatusConflict, CodeOrderConflict, "order_id", "order %q exists with different details", no.ID))
		return
	case err != nil:
		h.idem.Fail(w, r, "create order", err)
		return
	}
	q.Keep() // the order and its start committed; a retry takes the key over once its lease ends
	if order.Status == orders.StatusPending {
		req, err := orders.StartRequest(orders.NewOrderInput(tenant, no.ID), order)
		if err == nil {
			h.awaitRun(ctx, req, orderDecidingSteps, wait)
		}
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.timeout)
	defer cancel()
	var resp idempotency.Response
	err = pgx.BeginFunc(actx, h.db, func(tx pgx.Tx) error {
		now, err := h.store.GetTx(actx, tx, tenant, no.ID)
		if err != nil {
			return err
		}
		key, err := orders.NewOrderInput(tenant, no.ID).EffectKey(orders.StepCharge)
		if err != nil {
			return err
		}
		rec, err := h.effects.GetTx(actx, tx, key)
		if errors.Is(err, effects.ErrNotFound) {
			rec, err = nil, nil
		}
		if err != nil {
			return err
		}
		charge := chargeViewOf(rec)
		body, err := encodeBody(OrderCreated{Order: now, WorkflowID: orders.WorkflowID(tenant, no.ID), Charge: charge})
		if err != nil {
			return err
		}
		status := http.StatusAccepted
		switch {
		case now.Status == orders.StatusPending:
		case created:
			status = http.StatusCreated
		default:
			status = http.StatusOK
		}
		out := orderOutcomeOf(now)
		out.Order.Charge = charge
		if resp, err = responseOf(status, out, body); err != nil {
			return err
		}
		setWaited(w, &resp, "/v1/orders/"+url.PathEscape(no.ID), wait)
		return q.CompleteTx(actx, tx, resp)
	})
	if err != nil {
		h.idem.Fail(w, r, "create order", fmt.Errorf("store the answer: %w", err))
		return
	}
	resp.Write(w)
}

// createRefundWaiting is POST /v1/orders/{id}/refunds with Prefer: wait: the
// refund and its start commit first; then it waits up to wait for the
// refund to be refunded or refused; then it answers with the refund as it
// stands: 201 (200 for one requested before) once refunded or failed, else
// 202, each with Location.
func (h *Handler) createRefundWaiting(w http.ResponseWriter, r *http.Request, q *idempotency.Request, in refunds.RefundInput, wait time.Duration) {
	ctx := r.Context()
	var currency string
	var created bool
	err := h.refundTurnTx(ctx, in, func(tx pgx.Tx) error {
		order, c, err := refunds.RequestTx(ctx, tx, h.store, in)
		if err == nil {
			currency, created = order.Currency, c
		}
		return err
	})
	if refusal := refundRefusal(err, in); refusal != nil {
		writeError(w, refusal)
		return
	}
	if err != nil {
		h.idem.Fail(w, r, "request refund", err)
		return
	}
	q.Keep()
	if req, err := refunds.StartRequest(in, currency); err == nil {
		h.awaitRun(ctx, req, refundDecidingSteps, wait)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.timeout)
	defer cancel()
	var resp idempotency.Response
	err = pgx.BeginFunc(actx, h.db, func(tx pgx.Tx) error {
		order, err := h.store.GetTx(actx, tx, in.TenantID, in.OrderID)
		if err != nil {
			return err
		}
		view, err := h.refundView(actx, tx, order, in.RefundID)
		if err != nil {
			return err
		}
		body, err := encodeBody(view)
		if err != nil {
			return err
		}
		status := http.StatusAccepted
		switch {
		case view.State != RefundRefunded && view.State != RefundFailed:
		case created:
			status = http.StatusCreated
		default:
			status = http.StatusOK
		}
		if resp, err = responseOf(status, refundOutcomeOf(view), body); err != nil {
			return err
		}
		setWaited(w, &resp, "/v1/orders/"+url.PathEscape(in.OrderID)+"/refunds/"+url.PathEscape(in.RefundID), wait)
		return q.CompleteTx(actx, tx, resp)
	})
	if err != nil {
		h.idem.Fail(w, r, "request refund", fmt.Errorf("store the answer: %w", err))
		return
	}
	resp.Write(w)
}
