package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/idempotency"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// Route patterns of refunds, as they appear in the "route" metric label.
const (
	RouteCreateRefund = "POST /v1/orders/{id}/refunds"
	RouteGetRefund    = "GET /v1/orders/{id}/refunds/{refund_id}"
)

// States of a refund in RefundView.
const (
	// RefundRequested: its start is queued or its run has not reserved it
	// yet.
	RefundRequested = "requested"
	// RefundReserved: it is in the order's ledger; Stripe has not
	// confirmed it yet.
	RefundReserved = "reserved"
	// RefundRefunded: Stripe refunded it.
	RefundRefunded = "refunded"
	// RefundFailed: a step failed for good; ErrorCode says which way.
	// Released says whether its reservation was given back (Stripe refused
	// the refund), so that what it reserved can be refunded again.
	RefundFailed = "failed"
	// RefundNeedsAttention: a step's outcome is unknown (ErrorCode
	// ambiguous or key_reused); the refund's run waits for an operator's
	// decision, after which it goes on.
	RefundNeedsAttention = "needs_attention"
)

// refundMembers are the members of a POST /v1/orders/{id}/refunds body,
// spelled exactly.
var refundMembers = []string{"refund_id", "amount_minor", "reason"}

// createRefundRequest is the body of POST /v1/orders/{id}/refunds.
// Pointers tell a missing member from a zero one.
type createRefundRequest struct {
	RefundID    *string `json:"refund_id"`
	AmountMinor *int64  `json:"amount_minor"`
	Reason      *string `json:"reason"`
}

// RefundView is a refund of an order as a tenant sees it: the body of a
// 202 or 200 answer to POST /v1/orders/{id}/refunds, of GET
// /v1/orders/{id}/refunds/{refund_id}, and an element of
// OrderDetail.Refunds.
type RefundView struct {
	RefundID    string `json:"refund_id"`
	OrderID     string `json:"order_id"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
	Reason      string `json:"reason,omitempty"`
	// State is requested, reserved, refunded, failed or needs_attention.
	State string `json:"state"`
	// ErrorCode and Error are set when State is failed or needs_attention:
	// a stable code of the step that failed or waits (as EffectView shows
	// it) and a plain message.
	ErrorCode string `json:"error_code,omitempty"`
	Error     string `json:"error,omitempty"`
	// Released is set when Stripe refused the refund for good and its
	// reservation was given back: it no longer counts in the order's
	// reserved_minor (nor ever did in its refunded_minor). RefusalCode is
	// Stripe's code, such as "charge_disputed".
	Released       bool   `json:"released,omitempty"`
	RefusalCode    string `json:"refusal_code,omitempty"`
	StripeRefundID string `json:"stripe_refund_id,omitempty"`
	WorkflowID     string `json:"workflow_id"`
	// Start is the state of the refund run's start, or nil once its
	// outbox row was pruned.
	Start *StartView `json:"start,omitempty"`
	// Effects are the refund's effect records.
	Effects []EffectView `json:"effects"`
}

// decodeRefund reads one JSON object of known members; refund_id and
// amount_minor are required, reason is optional.
func (h *Handler) decodeRefund(w http.ResponseWriter, r *http.Request) (createRefundRequest, *Error) {
	req, aerr := decodeStrict[createRefundRequest](h, w, r, refundMembers)
	if aerr != nil {
		return req, aerr
	}
	switch {
	case req.RefundID == nil:
		return req, newError(http.StatusBadRequest, CodeMissingField, "refund_id", "refund_id is required")
	case req.AmountMinor == nil:
		return req, newError(http.StatusBadRequest, CodeMissingField, "amount_minor", "amount_minor is required")
	}
	return req, nil
}

// refundInput validates the request as the refund's input, or answers 400
// naming the member at fault.
func refundInput(tenant, orderID string, req createRefundRequest) (refunds.RefundInput, *Error) {
	reason := ""
	if req.Reason != nil {
		reason = *req.Reason
	}
	in := refunds.NewInput(tenant, orderID, *req.RefundID, *req.AmountMinor, reason)
	if _, err := effects.NewKey(tenant, "order", orderID); err != nil {
		return in, newError(http.StatusBadRequest, CodeInvalidField, "id", "%s is not a valid order ID", echo(orderID))
	}
	if reason := orders.CheckID(in.RefundID); reason != "" {
		return in, newError(http.StatusBadRequest, CodeInvalidField, "refund_id", "%s is not a valid refund ID: %s", echo(in.RefundID), reason)
	}
	if in.AmountMinor <= 0 || in.AmountMinor > refunds.MaxAmountMinor {
		return in, newError(http.StatusBadRequest, CodeInvalidField, "amount_minor",
			"%d is not a positive amount in minor units of at most %d", in.AmountMinor, refunds.MaxAmountMinor)
	}
	if err := in.Validate(); errors.Is(err, effects.ErrInvalidKey) {
		return in, newError(http.StatusBadRequest, CodeInvalidField, "refund_id",
			"%s is too long for this order: its effect keys would be over %d bytes", echo(in.RefundID), effects.MaxKeyLen)
	} else if err != nil {
		return in, newError(http.StatusBadRequest, CodeInvalidField, "reason",
			"reason must be at most %d bytes of printable characters", refunds.MaxReasonBytes)
	}
	return in, nil
}

// refundHash is the fingerprint of a refund request: the route, the order
// and the validated refund, so that member order and whitespace do not
// matter but every value does.
func refundHash(in refunds.RefundInput) string {
	canon, _ := json.Marshal(struct {
		Route       string `json:"route"`
		OrderID     string `json:"order_id"`
		RefundID    string `json:"refund_id"`
		AmountMinor int64  `json:"amount_minor"`
		Reason      string `json:"reason"`
	}{RouteCreateRefund, in.OrderID, in.RefundID, in.AmountMinor, in.Reason})
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:])
}

func (h *Handler) createRefund(w http.ResponseWriter, r *http.Request, _ string) {
	q := idempotency.FromContext(r.Context())
	in := q.Value().(refunds.RefundInput)
	if wait, ok := h.preferredWait(r); ok {
		h.createRefundWaiting(w, r, q, in, wait)
		return
	}
	resp, refusal, err := h.refundTx(r.Context(), q, in)
	switch {
	case refusal != nil:
		writeError(w, refusal)
	case err != nil:
		h.idem.Fail(w, r, "request refund", err)
	default:
		resp.Write(w)
	}
}

// refundTurnTx runs fn in a transaction, in the turn of in's order among
// this process's refund requests: RequestTx's lock would run them one at a
// time anyway, and those waiting here hold no pooled connection. It returns
// ctx's error if the turn does not come before ctx ends, else fn's.
func (h *Handler) refundTurnTx(ctx context.Context, in refunds.RefundInput, fn func(pgx.Tx) error) error {
	done, err := h.refundTurns.enter(ctx, in.TenantID+"\x00"+in.OrderID)
	if err != nil {
		return fmt.Errorf("wait for the order's other refund requests: %w", err)
	}
	defer done()
	return pgx.BeginFunc(ctx, h.db, fn)
}

// refundTx checks the refund against its order and records its start and
// the stored response (its outcome, which the route's replay turns into the
// body) in one transaction: all of them or none. Every read goes through the
// transaction. A refusal comes back as an *Error, and writes nothing.
func (h *Handler) refundTx(ctx context.Context, q *idempotency.Request, in refunds.RefundInput) (idempotency.Response, *Error, error) {
	var resp idempotency.Response
	err := h.refundTurnTx(ctx, in, func(tx pgx.Tx) error {
		order, created, err := refunds.RequestTx(ctx, tx, h.store, in)
		if err != nil {
			return err
		}
		view, err := h.refundView(ctx, tx, order, in.RefundID)
		if err != nil {
			return err
		}
		body, err := encodeBody(view)
		if err != nil {
			return err
		}
		status := http.StatusOK
		if created {
			status = http.StatusAccepted
		}
		if resp, err = responseOf(status, refundOutcomeOf(view), body); err != nil {
			return err
		}
		return q.CompleteTx(ctx, tx, resp)
	})
	if refusal := refundRefusal(err, in); refusal != nil {
		return resp, refusal, nil
	}
	return resp, nil, err
}

// refundRefusal is the answer to a refund refused by its order or ledger
// (err from refunds.RequestTx), or nil for success or a failure.
func refundRefusal(err error, in refunds.RefundInput) *Error {
	var exceeds *refunds.ExceedsError
	switch {
	case errors.Is(err, orders.ErrNotFound):
		return newError(http.StatusNotFound, CodeNotFound, "id", "no order %q", in.OrderID)
	case errors.Is(err, refunds.ErrConflict):
		return newError(http.StatusConflict, CodeRefundConflict, "refund_id",
			"refund %q of order %q was requested with another amount or reason; use a new refund_id for a new refund", in.RefundID, in.OrderID)
	case errors.Is(err, refunds.ErrNotRefundable):
		return newError(http.StatusConflict, CodeOrderNotRefundable, "id",
			"order %q is not refundable: only a paid order that is not refunded in full is", in.OrderID)
	case errors.Is(err, refunds.ErrTooManyRefunds):
		return newError(http.StatusUnprocessableEntity, CodeTooManyRefunds, "refund_id",
			"order %q has %d refunds, the most one order may have", in.OrderID, refunds.MaxPerOrder)
	case errors.As(err, &exceeds):
		return newError(http.StatusUnprocessableEntity, CodeRefundExceedsCharge, "amount_minor",
			"a refund of %d exceeds what is left of the charge: %d charged, %d refunded or in flight, %d left (minor units)",
			exceeds.AmountMinor, exceeds.ChargedMinor, exceeds.RefundedMinor, exceeds.ChargedMinor-exceeds.RefundedMinor)
	}
	return nil
}

func (h *Handler) getRefund(w http.ResponseWriter, r *http.Request, tenant string) {
	id, refundID := r.PathValue("id"), r.PathValue("refund_id")
	if _, err := effects.NewKey(tenant, "order", id, "refund", refundID); err != nil {
		writeError(w, newError(http.StatusBadRequest, CodeInvalidField, "refund_id", "%s of order %s is not a valid refund ID", echo(refundID), echo(id)))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	var view *RefundView
	err := h.readTx(ctx, func(tx pgx.Tx) error {
		order, err := h.store.GetTx(ctx, tx, tenant, id)
		if err != nil {
			return err
		}
		view, err = h.refundView(ctx, tx, order, refundID)
		return err
	})
	switch {
	case errors.Is(err, orders.ErrNotFound):
		writeError(w, newError(http.StatusNotFound, CodeNotFound, "id", "no order %q", id))
		return
	case errors.Is(err, refunds.ErrNotFound):
		writeError(w, newError(http.StatusNotFound, CodeNotFound, "refund_id", "no refund %q of order %q", refundID, id))
		return
	case err != nil:
		h.dbFailure(w, r, "get refund", err)
		return
	}
	body, err := json.Marshal(view)
	if err != nil {
		h.dbFailure(w, r, "encode refund", err)
		return
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
}

// refundView reads the order's refund refundID through tx, the request's
// transaction, and returns the tenant's view of it. It returns an error
// wrapping refunds.ErrNotFound when there is no such refund.
func (h *Handler) refundView(ctx context.Context, tx pgx.Tx, order *orders.Order, refundID string) (*RefundView, error) {
	ledger, err := refunds.NewLedger(tx)
	if err != nil {
		return nil, err
	}
	ref, err := ledger.Refund(ctx, order.TenantID, order.ID, refundID)
	if err != nil {
		return nil, err
	}
	return h.viewOf(ctx, tx, order, *ref)
}

// viewOf completes ref's view with its start and its effect records, read
// through tx.
func (h *Handler) viewOf(ctx context.Context, tx pgx.Tx, order *orders.Order, ref refunds.Refund) (*RefundView, error) {
	v := newRefundView(order, ref)
	start, err := h.startOf(ctx, tx, v.WorkflowID)
	if err != nil {
		return nil, err
	}
	v.Start = start
	prefix, err := refundPrefix(order, ref)
	if err != nil {
		return nil, err
	}
	recs, err := h.effects.ListTx(ctx, tx, prefix)
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		v.Effects = append(v.Effects, effectView(rec))
	}
	setRefundState(v, ref)
	return v, nil
}

// newRefundView is ref's view before its start, effects and state.
func newRefundView(order *orders.Order, ref refunds.Refund) *RefundView {
	in := refunds.NewInput(order.TenantID, order.ID, ref.RefundID, ref.AmountMinor, ref.Reason)
	return &RefundView{RefundID: ref.RefundID, OrderID: order.ID, AmountMinor: ref.AmountMinor, Currency: order.Currency,
		Reason: ref.Reason, State: RefundRequested, WorkflowID: in.WorkflowID(), Effects: []EffectView{}}
}

// refundPrefix is the key every effect of ref's run extends.
func refundPrefix(order *orders.Order, ref refunds.Refund) (effects.Key, error) {
	prefix, err := effects.NewKey(order.TenantID, "order", order.ID, "refund", ref.RefundID)
	if err != nil {
		return effects.Key{}, fmt.Errorf("refund %s of order %s: %w", ref.RefundID, order.ID, err)
	}
	return prefix, nil
}

// setRefundState sets v's State from how far ref got and its effects: a
// Stripe refund makes it refunded, a ledger row reserved; before Stripe
// refunded it, a step whose outcome is unknown (unknownOutcome: its run
// waits for a decision) makes it needs_attention, and a step that failed
// for good makes it failed, each with that step's code and message. A
// release makes it failed (provider_rejected) and released, with Stripe's
// refusal code, whether or not the failed record is still there.
func setRefundState(v *RefundView, ref refunds.Refund) {
	switch {
	case ref.Stripe != nil:
		v.State, v.StripeRefundID = RefundRefunded, ref.Stripe.RefundID
		return
	case ref.Release != nil:
		v.State, v.ErrorCode, v.Error = RefundFailed, codeProviderRejected, "Stripe refused this refund; what it reserved was given back"
		v.Released, v.RefusalCode = true, ref.Release.Code
		return
	case ref.Entry != nil:
		v.State = RefundReserved
	}
	for _, e := range v.Effects {
		if e.State != effects.StateFailedTerminal {
			continue
		}
		v.State, v.ErrorCode, v.Error = RefundFailed, e.ErrorCode, e.Error
		if unknownOutcome(e.ErrorCode) {
			v.State = RefundNeedsAttention
		}
		return
	}
}

// codeProviderRejected is the code of a step Stripe refused.
var codeProviderRejected = step.CodeProviderRejected

// unknownOutcome reports whether a failed record's code says its outcome is
// unknown (Ambiguous, KeyReused), so that its run waits for a decision.
func unknownOutcome(code string) bool {
	typ, _ := step.ErrorType(&effects.TerminalError{Code: code})
	return typ == step.ErrTypeAmbiguous || typ == step.ErrTypeKeyReused
}

// startOf returns the tenant's view of the workflow's start, or nil when
// its outbox row is gone.
func (h *Handler) startOf(ctx context.Context, db effects.DB, workflowID string) (*StartView, error) {
	entry, err := outbox.Get(ctx, db, workflowID)
	if errors.Is(err, outbox.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return h.tenantStartView(ctx, entry), nil
}

// tenantStartView is entry's view for the tenant; the start's error, which
// the tenant does not see, goes to the debug log.
func (h *Handler) tenantStartView(ctx context.Context, entry *outbox.Entry) *StartView {
	if entry.LastError != "" {
		h.logger.DebugContext(ctx, "start error withheld from the tenant", "workflow_id", entry.WorkflowID, "last_error", entry.LastError)
	}
	return startView(entry)
}

// orderRefunds sets detail's view of each of the order's refunds, read
// through tx, oldest first, what the order has refunded (confirmed by
// Stripe) and what its refunds hold of the charge (in the ledger and not
// released). recs are the order's effect records, which hold its refunds';
// each refund's go in its view, and orderRefunds returns the rest, the
// order's own. Its statements do not grow with the refunds. It returns
// database errors.
func (h *Handler) orderRefunds(ctx context.Context, tx pgx.Tx, order *orders.Order, recs []*effects.Record, detail *OrderDetail) ([]*effects.Record, error) {
	ledger, err := refunds.NewLedger(tx)
	if err != nil {
		return nil, err
	}
	refs, err := ledger.Refunds(ctx, order.TenantID, order.ID)
	if err != nil {
		return nil, err
	}
	views := make([]*RefundView, len(refs))
	ids := make([]string, len(refs))
	byPrefix := make(map[string]*RefundView, len(refs))
	for i, ref := range refs {
		views[i] = newRefundView(order, ref)
		ids[i] = views[i].WorkflowID
		prefix, err := refundPrefix(order, ref)
		if err != nil {
			return nil, err
		}
		byPrefix[prefix.String()+effects.Separator] = views[i]
	}
	starts, err := outbox.GetMany(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	own := recs[:0:0]
	for _, rec := range recs {
		if v := refundOf(byPrefix, rec.Key); v != nil {
			v.Effects = append(v.Effects, effectView(rec))
			continue
		}
		own = append(own, rec)
	}
	detail.Refunds = make([]RefundView, 0, len(refs))
	for i, ref := range refs {
		v := views[i]
		if entry := starts[v.WorkflowID]; entry != nil {
			v.Start = h.tenantStartView(ctx, entry)
		}
		setRefundState(v, ref)
		detail.RefundedMinor += ref.Refunded()
		detail.ReservedMinor += ref.Reserved()
		detail.Refunds = append(detail.Refunds, *v)
	}
	return own, nil
}

// refundOf returns the view whose key prefix (with its separator) key
// starts with, or nil.
func refundOf(byPrefix map[string]*RefundView, key string) *RefundView {
	sep := effects.Separator
	for i := strings.LastIndex(key, sep); i > 0; i = strings.LastIndex(key[:i], sep) {
		if v, ok := byPrefix[key[:i+len(sep)]]; ok {
			return v
		}
	}
	return nil
}
