package api

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// outcomeVersion is the version of outcome and of the renderers that turn
// it back into a body. A change to what a rendered body holds is a new
// version, with the old renderers kept for the records written before:
// a replay must be byte for byte.
const outcomeVersion = 1

// outcome is what an Idempotency-Key record keeps of a POST's response in
// place of its body: what the server decided, never what the request carried
// (no email, no refund reason). One member is set, by route.
type outcome struct {
	V      int            `json:"v"`
	Order  *orderOutcome  `json:"order,omitempty"`
	Refund *refundOutcome `json:"refund,omitempty"`
}

// orderOutcome is what POST /v1/orders decided: the order's status and
// times as the first response showed them. The rest of OrderCreated is the
// request's (order ID, amount, currency, customer email, payment method)
// and the tenant's (its ID, the workflow ID).
type orderOutcome struct {
	Status    orders.Status `json:"status"`
	CreatedAt time.Time     `json:"created_at"`
	UpdatedAt time.Time     `json:"updated_at"`
	// Charge is set in an answer that waited (Prefer: wait); a record
	// without it renders the body it rendered before.
	Charge *ChargeView `json:"charge,omitempty"`
}

// refundOutcome is what POST /v1/orders/{id}/refunds decided: the refund
// as the first response showed it, less what the request carried (refund
// ID, order ID, amount, reason) and the workflow ID that derives from it.
type refundOutcome struct {
	Currency       string       `json:"currency"`
	State          string       `json:"state"`
	ErrorCode      string       `json:"error_code,omitempty"`
	Error          string       `json:"error,omitempty"`
	Released       bool         `json:"released,omitempty"`
	RefusalCode    string       `json:"refusal_code,omitempty"`
	StripeRefundID string       `json:"stripe_refund_id,omitempty"`
	Start          *StartView   `json:"start,omitempty"`
	Effects        []EffectView `json:"effects"`
}

// renderer renders a response body from its outcome and the request.
type renderer func(*outcome) ([]byte, error)

// encodeBody returns v as JSON and a newline, the body of every response.
func encodeBody(v any) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode response: %w", err)
	}
	return append(body, '\n'), nil
}

// orderOutcomeOf is what the record keeps of order's OrderCreated.
func orderOutcomeOf(order *orders.Order) *outcome {
	return &outcome{V: outcomeVersion, Order: &orderOutcome{Status: order.Status, CreatedAt: order.CreatedAt, UpdatedAt: order.UpdatedAt}}
}

// orderRenderer renders the OrderCreated of tenant's request no.
func orderRenderer(tenant string, no orders.NewOrder) renderer {
	return func(out *outcome) ([]byte, error) {
		if out.V != outcomeVersion || out.Order == nil {
			return nil, fmt.Errorf("replay: stored outcome version %d holds no order", out.V)
		}
		o := out.Order
		return encodeBody(OrderCreated{Order: &orders.Order{TenantID: tenant, ID: no.ID, AmountMinor: no.AmountMinor,
			Currency: no.Currency, CustomerEmail: no.CustomerEmail, PaymentMethod: no.PaymentMethod,
			Status: o.Status, CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt}, WorkflowID: orders.WorkflowID(tenant, no.ID), Charge: o.Charge})
	}
}

// refundOutcomeOf is what the record keeps of v.
func refundOutcomeOf(v *RefundView) *outcome {
	return &outcome{V: outcomeVersion, Refund: &refundOutcome{Currency: v.Currency, State: v.State, ErrorCode: v.ErrorCode,
		Error: v.Error, Released: v.Released, RefusalCode: v.RefusalCode, StripeRefundID: v.StripeRefundID,
		Start: v.Start, Effects: v.Effects}}
}

// refundRenderer renders the RefundView of the refund request in.
func refundRenderer(in refunds.RefundInput) renderer {
	return func(out *outcome) ([]byte, error) {
		if out.V != outcomeVersion || out.Refund == nil {
			return nil, fmt.Errorf("replay: stored outcome version %d holds no refund", out.V)
		}
		o := out.Refund
		return encodeBody(RefundView{RefundID: in.RefundID, OrderID: in.OrderID, AmountMinor: in.AmountMinor,
			Currency: o.Currency, Reason: in.Reason, State: o.State, ErrorCode: o.ErrorCode, Error: o.Error,
			Released: o.Released, RefusalCode: o.RefusalCode, StripeRefundID: o.StripeRefundID,
			WorkflowID: in.WorkflowID(), Start: o.Start, Effects: o.Effects})
	}
}
