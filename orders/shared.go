package orders

import (
	"fmt"
	"strings"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/step"
)

// This file holds what the workflow, its activities, the worker and every
// starter share: the task queue, the versioned workflow input, the IDs and
// effect keys derived from the business event, and the step results.

// TaskQueue is the default Temporal task queue for the order pipeline.
const TaskQueue = "keyed-orders"

// WorkflowName is the registered name of the order workflow.
const WorkflowName = "OrderWorkflow"

// Search attribute names set on every order workflow run. Register them as
// Keyword attributes on the namespace (the dev server in make demo and the
// tests does this for you).
const (
	SearchAttrTenantID = "TenantID"
	SearchAttrOrderID  = "OrderID"
)

// Steps of the order pipeline. Each is one activity with its own effect key.
// StepMarkFailed runs instead of StepMarkPaid and StepReceipt when the
// charge fails terminally.
const (
	StepCharge     = "charge"
	StepMarkPaid   = "mark_paid"
	StepReceipt    = "receipt"
	StepMarkFailed = "mark_failed"
)

// OrderInputVersion is the only input version this code understands.
const OrderInputVersion = 1

// OrderInput is the order workflow's input and every activity's input:
// identifiers and a version, never a serialized order; activities load the
// order's current state when they run.
type OrderInput struct {
	V        int    `json:"v"`
	TenantID string `json:"tenant_id"`
	OrderID  string `json:"order_id"`
}

// NewOrderInput returns a current-version input for an order.
func NewOrderInput(tenantID, orderID string) OrderInput {
	return OrderInput{V: OrderInputVersion, TenantID: tenantID, OrderID: orderID}
}

// Validate returns an error wrapping step.ErrUnsupportedVersion for an unknown
// version, or one wrapping effects.ErrInvalidKey when the tenant or order ID
// cannot form an effect key.
func (in OrderInput) Validate() error {
	if in.V != OrderInputVersion {
		return fmt.Errorf("%w: v=%d (this code understands v=%d)", step.ErrUnsupportedVersion, in.V, OrderInputVersion)
	}
	_, err := in.EffectKey(StepCharge)
	return err
}

// WorkflowID returns the order workflow's ID, derived from the business
// event so that duplicate starts collapse: "order:acme:9f3a:fulfil".
func (in OrderInput) WorkflowID() string {
	return WorkflowID(in.TenantID, in.OrderID)
}

// WorkflowID returns the order workflow ID for tenant and order.
func WorkflowID(tenantID, orderID string) string {
	return "order:" + tenantID + ":" + orderID + ":fulfil"
}

// ParseWorkflowID returns the tenant and order of an order run's ID, the
// inverse of WorkflowID.
func ParseWorkflowID(id string) (tenantID, orderID string, ok bool) {
	parts := strings.Split(id, ":")
	if len(parts) != 4 || parts[0] != "order" || parts[3] != "fulfil" || WorkflowID(parts[1], parts[2]) != id {
		return "", "", false
	}
	return parts[1], parts[2], true
}

// WorkflowIDOfKey returns the workflow ID of the order run whose step makes
// the effect k, and that step, when k is an order step's key:
// "acme:order:9f3a:receipt" gives "order:acme:9f3a:fulfil" and "receipt".
// ok is false for any other key (a refund's, another pipeline's).
func WorkflowIDOfKey(k effects.Key) (id, step string, ok bool) {
	parts := k.Parts()
	if len(parts) != 3 || parts[0] != "order" {
		return "", "", false
	}
	return WorkflowID(k.Tenant(), parts[1]), parts[2], true
}

// EffectKey returns the effect key of one step of the order, such as
// "acme:order:9f3a:charge". It returns an error wrapping effects.ErrInvalidKey
// when the tenant or order ID is not a valid key part.
func (in OrderInput) EffectKey(step string) (effects.Key, error) {
	return effects.NewKey(in.TenantID, "order", in.OrderID, step)
}

// LogAttrs names the tenant and the order in a step's log records.
func (in OrderInput) LogAttrs() []any {
	return []any{"tenant_id", in.TenantID, "order_id", in.OrderID}
}

// OrderKey returns the key prefix shared by all of an order's effects, for
// listing them: "acme:order:9f3a".
func OrderKey(tenantID, orderID string) (effects.Key, error) {
	return effects.NewKey(tenantID, "order", orderID)
}

// ChargeResult is the stored outcome of the charge step.
type ChargeResult struct {
	PaymentIntentID string `json:"payment_intent_id"`
	Status          string `json:"status"`
	AmountMinor     int64  `json:"amount_minor"`
	Currency        string `json:"currency"`
}

// MarkPaidResult is the stored outcome of the mark-paid step.
type MarkPaidResult struct {
	Status string `json:"status"`
}

// MarkFailedResult is the stored outcome of the mark-failed step. ChargeError
// is the error code stored with the failed charge, such as "card_declined".
type MarkFailedResult struct {
	Status      string `json:"status"`
	ChargeError string `json:"charge_error,omitempty"`
}

// ReceiptResult is the stored outcome of the receipt step. MessageID is the
// provider's message ID; Collapsed is true when the collapse window dropped
// the send as a repeat of a recent one.
type ReceiptResult struct {
	MessageID string `json:"message_id,omitempty"`
	Collapsed bool   `json:"collapsed,omitempty"`
}

// OrderResult is the order workflow's result.
type OrderResult struct {
	Charge  ChargeResult   `json:"charge"`
	Paid    MarkPaidResult `json:"paid"`
	Receipt ReceiptResult  `json:"receipt"`
}
