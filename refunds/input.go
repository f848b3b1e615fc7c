package refunds

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// WorkflowName is the registered name of the refund workflow.
const WorkflowName = "RefundWorkflow"

// Steps of the refund workflow. Each is one activity with its own effect
// key, "<tenant>:order:<order>:refund:<refund_id>:<step>".
const (
	StepReserve = "refund_reserve"
	StepStripe  = "refund_stripe"
	StepMark    = "refund_mark"
	StepEmail   = "refund_email"
	// StepRelease runs only when Stripe refused the refund for good: it
	// gives the reservation back (ReleaseRefund).
	StepRelease = "refund_release"
)

// InputVersion is the only RefundInput version this code understands.
const InputVersion = 1

// Bounds of a RefundInput.
const (
	// MaxAmountMinor is the largest amount Stripe accepts.
	MaxAmountMinor = 99_999_999
	// MaxReasonBytes bounds the reason, which is stored in the ledger and
	// sent to Stripe as metadata (whose values Stripe caps at 500).
	MaxReasonBytes = 200
	// MaxRefundIDBytes bounds the refund ID, as orders bound theirs.
	MaxRefundIDBytes = 64
)

// RefundInput is the refund workflow's input and every refund activity's: the
// order, the refund's own ID (unique per order) and what to refund. Reserve
// copies the amount and reason into the ledger and later steps read the
// ledger; the Reserve claim's fingerprint holds them, so the same refund ID
// with another amount or reason fails with KeyReused.
type RefundInput struct {
	V           int    `json:"v"`
	TenantID    string `json:"tenant_id"`
	OrderID     string `json:"order_id"`
	RefundID    string `json:"refund_id"`
	AmountMinor int64  `json:"amount_minor"`
	Reason      string `json:"reason,omitempty"`
}

// NewInput returns a current-version input.
func NewInput(tenantID, orderID, refundID string, amountMinor int64, reason string) RefundInput {
	return RefundInput{V: InputVersion, TenantID: tenantID, OrderID: orderID, RefundID: refundID, AmountMinor: amountMinor, Reason: reason}
}

// Validate returns an error wrapping step.ErrUnsupportedVersion for an
// unknown version, effects.ErrInvalidKey when the IDs cannot form an effect
// key, and step.ErrInvalidInput for a refund ID over MaxRefundIDBytes, an amount
// outside 1..MaxAmountMinor, or a reason over MaxReasonBytes or holding a
// control or invisible character.
func (in RefundInput) Validate() error {
	if in.V != InputVersion {
		return fmt.Errorf("%w: refund input v=%d (this code understands v=%d)", step.ErrUnsupportedVersion, in.V, InputVersion)
	}
	if _, err := in.EffectKey(StepReserve); err != nil {
		return err
	}
	switch {
	case len(in.RefundID) > MaxRefundIDBytes:
		return fmt.Errorf("%w: refund_id is longer than %d bytes", step.ErrInvalidInput, MaxRefundIDBytes)
	case in.AmountMinor <= 0 || in.AmountMinor > MaxAmountMinor:
		return fmt.Errorf("%w: amount_minor %d is not in 1..%d", step.ErrInvalidInput, in.AmountMinor, MaxAmountMinor)
	case len(in.Reason) > MaxReasonBytes:
		return fmt.Errorf("%w: reason is longer than %d bytes", step.ErrInvalidInput, MaxReasonBytes)
	}
	for _, r := range in.Reason {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: reason holds the character %U", step.ErrInvalidInput, r)
		}
	}
	return nil
}

// WorkflowID returns the refund workflow's ID, derived from the business
// event so that duplicate starts collapse: "refund:acme:9f3a:r1".
func (in RefundInput) WorkflowID() string {
	return "refund:" + in.TenantID + ":" + in.OrderID + ":" + in.RefundID
}

// ParseWorkflowID returns the refund (its IDs only) of a refund run's ID,
// the inverse of RefundInput.WorkflowID.
func ParseWorkflowID(id string) (RefundInput, bool) {
	parts := strings.Split(id, ":")
	if len(parts) != 4 || parts[0] != "refund" {
		return RefundInput{}, false
	}
	in := RefundInput{TenantID: parts[1], OrderID: parts[2], RefundID: parts[3]}
	return in, in.WorkflowID() == id
}

// WorkflowIDOfKey returns the refund run's workflow ID and the step that
// makes k: "acme:order:9f3a:refund:r1:refund_email" gives
// "refund:acme:9f3a:r1" and "refund_email". ok is false for other keys.
func WorkflowIDOfKey(k effects.Key) (id, step string, ok bool) {
	in, step, ok := RefundOfKey(k)
	if !ok {
		return "", "", false
	}
	return in.WorkflowID(), step, true
}

// refundOfKey returns the refund (its IDs only) and the step of a refund
// step's key; ok is false for any other key.
func RefundOfKey(k effects.Key) (in RefundInput, step string, ok bool) {
	parts := k.Parts()
	if len(parts) != 5 || parts[0] != "order" || parts[2] != "refund" {
		return RefundInput{}, "", false
	}
	return RefundInput{TenantID: k.Tenant(), OrderID: parts[1], RefundID: parts[3]}, parts[4], true
}

// EffectKey returns the effect key of one step of the refund, such as
// "acme:order:9f3a:refund:r1:refund_reserve". It returns an error wrapping
// effects.ErrInvalidKey when an ID is not a valid key part.
func (in RefundInput) EffectKey(step string) (effects.Key, error) {
	return effects.NewKey(in.TenantID, "order", in.OrderID, "refund", in.RefundID, step)
}

// LogAttrs names the tenant, order and refund in the step's log records
// (step.Input).
func (in RefundInput) LogAttrs() []any {
	return []any{"tenant_id", in.TenantID, "order_id", in.OrderID, "refund_id", in.RefundID}
}

// OrderKey returns the order's key, "acme:order:9f3a": the entity Reserve
// and MarkRefunded lock.
func (in RefundInput) OrderKey() (effects.Key, error) {
	return orders.OrderKey(in.TenantID, in.OrderID)
}

// ReserveResult is the stored outcome of the reserve step: the refund's
// ledger row as reserved, and what the order's refunds held of its charge
// with it (RefundedMinor, Ledger.ReservedTx: refunds in flight included,
// released ones not).
type ReserveResult struct {
	AmountMinor   int64  `json:"amount_minor"`
	Currency      string `json:"currency"`
	RefundedMinor int64  `json:"refunded_minor"`
	ChargedMinor  int64  `json:"charged_minor"`
}

// StripeResult is the stored outcome of the refund at Stripe.
type StripeResult struct {
	RefundID        string `json:"stripe_refund_id"`
	PaymentIntentID string `json:"payment_intent_id"`
	Status          string `json:"status"`
	AmountMinor     int64  `json:"amount_minor"`
	Currency        string `json:"currency"`
}

// MarkResult is the stored outcome of the mark-refunded step: the order's
// status after it.
type MarkResult struct {
	Status string `json:"status"`
}

// EmailResult is the stored outcome of the refund email: the provider's
// message ID, or Collapsed when the collapse window dropped it.
type EmailResult struct {
	MessageID string `json:"message_id,omitempty"`
	Collapsed bool   `json:"collapsed,omitempty"`
}

// ReleaseResult is the stored outcome of the release step: the amount
// given back, Stripe's refusal code, and what the order's refunds hold of
// its charge after it (RefundedMinor, Ledger.ReservedTx: ledger minus
// releases, refunds in flight included).
type ReleaseResult struct {
	AmountMinor   int64  `json:"amount_minor"`
	Code          string `json:"code"`
	RefundedMinor int64  `json:"refunded_minor"`
}

// Result is the refund workflow's result.
type Result struct {
	Reserve ReserveResult `json:"reserve"`
	Stripe  StripeResult  `json:"stripe"`
	Mark    MarkResult    `json:"mark"`
	Email   EmailResult   `json:"email"`
}
