package refunds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/step"
)

// ErrNotRefundable means the order is not paid (pending, failed) or is
// refunded in full already: there is nothing to refund.
var ErrNotRefundable = errors.New("order is not refundable")

// MaxPerOrder is how many refunds one order may have: requested, in
// flight, done or refused, each counted once. It bounds what an order's
// view lists (GET /v1/orders/{id} shows every refund) and so what one read
// of it costs.
const MaxPerOrder = 100

// ErrTooManyRefunds means the order has MaxPerOrder refunds already.
var ErrTooManyRefunds = fmt.Errorf("order has %d refunds, the most one order may have", MaxPerOrder)

// Keys of the outbox.Request.Meta that StartRequest writes: the refund's
// currency and amount, which starters put in the run's summary without
// loading the order.
const (
	MetaAmountMinor = orders.MetaAmountMinor
	MetaCurrency    = orders.MetaCurrency
)

// StartRequest returns the outbox request that starts in's refund run:
// workflow type WorkflowName, workflow ID in.WorkflowID(), in as the
// payload and the refund's amount with currency in the Meta. It returns an
// error wrapping outbox.ErrInvalid when in does not validate.
func StartRequest(in RefundInput, currency string) (outbox.Request, error) {
	if err := in.Validate(); err != nil {
		return outbox.Request{}, fmt.Errorf("%w: %w", outbox.ErrInvalid, err)
	}
	payload, err := json.Marshal(in)
	if err != nil {
		return outbox.Request{}, fmt.Errorf("encode input of %s: %w", in.WorkflowID(), err)
	}
	return outbox.Request{WorkflowType: WorkflowName, WorkflowID: in.WorkflowID(), TenantID: in.TenantID, Payload: payload,
		Meta: map[string]string{MetaAmountMinor: strconv.FormatInt(in.AmountMinor, 10), MetaCurrency: currency}}, nil
}

// FromStartRequest reads back what StartRequest wrote: the refund's input
// and its currency ("" when the Meta carries none). It returns an error
// wrapping outbox.ErrInvalid when req is not a refund run's or its payload
// does not decode to a valid input.
func FromStartRequest(req outbox.Request) (RefundInput, string, error) {
	if req.WorkflowType != WorkflowName {
		return RefundInput{}, "", fmt.Errorf("%w: %s is a %s run, not a refund run", outbox.ErrInvalid, req.WorkflowID, req.WorkflowType)
	}
	var in RefundInput
	if err := json.Unmarshal(req.Payload, &in); err != nil {
		return RefundInput{}, "", fmt.Errorf("%w: decode input of %s: %w", outbox.ErrInvalid, req.WorkflowID, err)
	}
	if err := in.Validate(); err != nil {
		return RefundInput{}, "", fmt.Errorf("%w: %w", outbox.ErrInvalid, err)
	}
	return in, req.Meta[MetaCurrency], nil
}

// RequestTx checks in against its order and the ledger and enqueues its refund
// run's start in tx; created=false when the same refund was requested already
// (nothing written). The refund ID must pass orders.CheckID. It first takes the order's request lock, held until tx
// ends, so that requests of one order count each other's refunds; Reserve
// repeats the amount checks and is their authority. It returns errors
// wrapping ErrInvalidInput (or the key's), orders.ErrNotFound, ErrConflict
// (same ID, other amount or reason), ErrNotRefundable (not paid, or refunded
// in full), an *ExceedsError (over the amount minus ReservedTx),
// ErrTooManyRefunds (the order has MaxPerOrder refunds), and database
// errors. On an error roll tx back.
func RequestTx(ctx context.Context, tx pgx.Tx, store *orders.Store, in RefundInput) (order *orders.Order, created bool, err error) {
	// The ID rule binds new requests only: Validate keeps accepting the
	// runs and outbox rows of refunds requested before it.
	if reason := orders.CheckID(in.RefundID); reason != "" {
		return nil, false, fmt.Errorf("request refund: %w: refund_id: %s", step.ErrInvalidInput, reason)
	}
	if err := in.Validate(); err != nil {
		return nil, false, fmt.Errorf("request refund %s: %w", in.WorkflowID(), err)
	}
	if err := lockRequestsTx(ctx, tx, in); err != nil {
		return nil, false, fmt.Errorf("request refund %s: %w", in.WorkflowID(), err)
	}
	order, err = store.GetTx(ctx, tx, in.TenantID, in.OrderID)
	if err != nil {
		return nil, false, fmt.Errorf("request refund %s: %w", in.WorkflowID(), err)
	}
	if found, err := sameRequest(ctx, tx, in); err != nil || found {
		return order, false, err
	}
	if !order.Status.Refundable() {
		return nil, false, fmt.Errorf("request refund %s: order is %s: %w", in.WorkflowID(), order.Status, ErrNotRefundable)
	}
	var n int
	if err := tx.QueryRow(ctx, countSQL, in.TenantID, in.OrderID).Scan(&n); err != nil {
		return nil, false, fmt.Errorf("count refunds of order %s/%s: %w", in.TenantID, in.OrderID, err)
	}
	if n >= MaxPerOrder {
		return nil, false, fmt.Errorf("request refund %s: %w", in.WorkflowID(), ErrTooManyRefunds)
	}
	var l Ledger
	refunded, err := l.ReservedTx(ctx, tx, in.TenantID, in.OrderID)
	if err != nil {
		return nil, false, err
	}
	if refunded+in.AmountMinor > order.AmountMinor {
		return nil, false, &ExceedsError{AmountMinor: in.AmountMinor, ChargedMinor: order.AmountMinor, RefundedMinor: refunded}
	}
	req, err := StartRequest(in, order.Currency)
	if err != nil {
		return nil, false, err
	}
	enqueued, err := outbox.EnqueueTx(ctx, tx, req)
	if err != nil {
		return nil, false, fmt.Errorf("request refund %s: %w", in.WorkflowID(), err)
	}
	if !enqueued { // a concurrent request of the same refund committed first
		if _, err := sameRequest(ctx, tx, in); err != nil {
			return nil, false, err
		}
	}
	return order, enqueued, nil
}

// sameRequest reports whether in's refund was requested already (its
// ledger row, else its outbox row), and returns an error wrapping
// ErrConflict when it was, with another amount or reason.
func sameRequest(ctx context.Context, db effects.DB, in RefundInput) (bool, error) {
	prev, err := requested(ctx, db, in.TenantID, in.OrderID, in.RefundID)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if prev.AmountMinor != in.AmountMinor || prev.Reason != in.Reason {
		return false, fmt.Errorf("request refund %s: %w", in.WorkflowID(), ErrConflict)
	}
	return true, nil
}

// Refund is a refund as requested, and how far it got: its ledger row once
// Reserve wrote it, Stripe's answer once RefundAtStripe recorded it, and
// its release once ReleaseRefund gave back what Stripe refused.
type Refund struct {
	RefundID    string `json:"refund_id"`
	AmountMinor int64  `json:"amount_minor"`
	Reason      string `json:"reason,omitempty"`
	// RequestedAt is when the refund's start was queued, or, once the
	// outbox row is pruned, when it was reserved.
	RequestedAt time.Time `json:"requested_at"`
	// Entry is the ledger row, nil until Reserve wrote it.
	Entry *Entry `json:"ledger,omitempty"`
	// Stripe is the Stripe refund, nil until RefundAtStripe recorded it.
	Stripe *StripeResult `json:"stripe,omitempty"`
	// Release is the reservation given back after Stripe refused the
	// refund for good, nil unless ReleaseRefund wrote it.
	Release *Release `json:"release,omitempty"`
}

// Refunded returns what r refunded of the order's charge, as confirmed by
// Stripe: the amount of its recorded Stripe refund, or 0 while it is
// requested, reserved and in flight, or released. It is what
// MarkRefunded's status counts (Ledger.ConfirmedTx).
func (r Refund) Refunded() int64 {
	if r.Stripe == nil {
		return 0
	}
	return r.Stripe.AmountMinor
}

// Reserved returns what r holds of the order's charge: its ledger amount,
// in flight or refunded, unless it is not reserved yet or was released. It
// is what a new refund must fit beside (Ledger.ReservedTx).
func (r Refund) Reserved() int64 {
	if r.Entry == nil || r.Release != nil {
		return 0
	}
	return r.Entry.AmountMinor
}

// Refund returns the order's refund refundID as requested (see Refund). It
// returns an error wrapping ErrNotFound when neither the ledger nor the
// outbox knows it, and database errors, wrapped.
func (l *Ledger) Refund(ctx context.Context, tenantID, orderID, refundID string) (*Refund, error) {
	r, err := requested(ctx, l.db, tenantID, orderID, refundID)
	if err != nil {
		return nil, err
	}
	return r, l.addStripe(ctx, r, tenantID, orderID)
}

// Refunds returns the order's refunds as requested (see Refund), oldest
// request first: those in the ledger and those only requested so far. It
// returns database errors, wrapped.
func (l *Ledger) Refunds(ctx context.Context, tenantID, orderID string) ([]Refund, error) {
	entries, err := l.List(ctx, tenantID, orderID)
	if err != nil {
		return nil, err
	}
	queued, err := queuedRefunds(ctx, l.db, tenantID, orderID)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]*Refund, len(queued))
	for i := range queued {
		byID[queued[i].RefundID] = &queued[i]
	}
	var extra []Refund
	for i := range entries {
		e := &entries[i]
		if r, ok := byID[e.RefundID]; ok {
			r.Entry = e
			continue
		}
		extra = append(extra, Refund{RefundID: e.RefundID, AmountMinor: e.AmountMinor, Reason: e.Reason, RequestedAt: e.CreatedAt, Entry: e})
	}
	out := append(queued, extra...)
	if err := l.addStripeAll(ctx, out, tenantID, orderID); err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].RequestedAt.Before(out[j].RequestedAt) })
	return out, nil
}

// addStripe adds r's Stripe outcome and release, once r is in the ledger.
func (l *Ledger) addStripe(ctx context.Context, r *Refund, tenantID, orderID string) error {
	if r.Entry == nil {
		return nil
	}
	s, found, err := l.StripeOutcome(ctx, tenantID, orderID, r.RefundID)
	if found {
		r.Stripe = &s
	}
	if err != nil {
		return err
	}
	r.Release, err = l.Released(ctx, tenantID, orderID, r.RefundID)
	return err
}

// addStripeAll is addStripe for every refund of one order, in two
// statements whatever their number.
func (l *Ledger) addStripeAll(ctx context.Context, refs []Refund, tenantID, orderID string) error {
	outcomes, err := l.db.Query(ctx, `SELECT `+stripeColumns+` FROM refund_stripe_outcomes
WHERE tenant_id = $1 AND order_id = $2`, tenantID, orderID)
	if err != nil {
		return fmt.Errorf("read Stripe refunds of order %s/%s: %w", tenantID, orderID, err)
	}
	stripe := map[string]StripeResult{}
	_, err = pgx.CollectRows(outcomes, func(row pgx.CollectableRow) (struct{}, error) {
		id, r, err := scanStripe(row)
		stripe[id] = r
		return struct{}{}, err
	})
	if err != nil {
		return fmt.Errorf("read Stripe refunds of order %s/%s: %w", tenantID, orderID, err)
	}
	releases, err := l.db.Query(ctx, `SELECT `+releaseColumns+` FROM refund_releases
WHERE tenant_id = $1 AND order_id = $2`, tenantID, orderID)
	if err != nil {
		return fmt.Errorf("read releases of order %s/%s: %w", tenantID, orderID, err)
	}
	released := map[string]*Release{}
	_, err = pgx.CollectRows(releases, func(row pgx.CollectableRow) (struct{}, error) {
		r, err := scanRelease(row, tenantID, orderID)
		released[r.RefundID] = r
		return struct{}{}, err
	})
	if err != nil {
		return fmt.Errorf("read releases of order %s/%s: %w", tenantID, orderID, err)
	}
	for i := range refs {
		r := &refs[i]
		if r.Entry == nil {
			continue
		}
		if s, ok := stripe[r.RefundID]; ok {
			r.Stripe = &s
		}
		r.Release = released[r.RefundID]
	}
	return nil
}

// requested returns the refund from its ledger row, else from its outbox
// row (whose time is kept as RequestedAt when both exist). It returns an
// error wrapping ErrNotFound when neither exists.
func requested(ctx context.Context, db effects.DB, tenantID, orderID, refundID string) (*Refund, error) {
	in := RefundInput{TenantID: tenantID, OrderID: orderID, RefundID: refundID}
	queued, qerr := queuedRefund(ctx, db, in.WorkflowID())
	if qerr != nil && !errors.Is(qerr, ErrNotFound) {
		return nil, qerr
	}
	e, err := get(ctx, db, tenantID, orderID, refundID)
	switch {
	case err == nil && queued != nil:
		queued.Entry = e
		return queued, nil
	case err == nil:
		return &Refund{RefundID: refundID, AmountMinor: e.AmountMinor, Reason: e.Reason, RequestedAt: e.CreatedAt, Entry: e}, nil
	case errors.Is(err, ErrNotFound) && queued != nil:
		return queued, nil
	}
	return nil, err
}

// outboxColumns reads a refund's outbox row.
const outboxColumns = `payload, created_at`

func scanQueued(row pgx.Row) (*Refund, error) {
	var payload []byte
	var at time.Time
	if err := row.Scan(&payload, &at); err != nil {
		return nil, err
	}
	var in RefundInput
	if err := json.Unmarshal(payload, &in); err != nil {
		return nil, fmt.Errorf("decode refund request: %w", err)
	}
	return &Refund{RefundID: in.RefundID, AmountMinor: in.AmountMinor, Reason: in.Reason, RequestedAt: at}, nil
}

// queuedRefund reads the refund's outbox row (kept for outbox.DefaultRetention
// after its start). It returns an error wrapping ErrNotFound when there is none.
func queuedRefund(ctx context.Context, db effects.DB, workflowID string) (*Refund, error) {
	r, err := scanQueued(db.QueryRow(ctx, `SELECT `+outboxColumns+` FROM keyed_outbox
WHERE workflow_id = $1 AND workflow_type = $2`, workflowID, WorkflowName))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("refund request %s: %w", workflowID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read refund request %s: %w", workflowID, err)
	}
	return r, nil
}

// queuedRefundsSQL reads an order's refund rows in the outbox through
// keyed_outbox_refunds_idx (app migration 17), whose condition names the
// workflow type as this literal does.
const queuedRefundsSQL = `SELECT ` + outboxColumns + ` FROM keyed_outbox
WHERE workflow_type = '` + WorkflowName + `' AND tenant_id = $1 AND payload->>'order_id' = $2 ORDER BY id`

// lockRequestsTx takes the refund-request lock of in's order until tx ends
// (effects.LockEntityTx on "<tenant>:order:<order>:refund_requests"; not
// the order's own lock, which Reserve takes, so that requests never wait for
// the pipeline). It returns the key's or the database's error.
func lockRequestsTx(ctx context.Context, tx pgx.Tx, in RefundInput) error {
	order, err := orders.OrderKey(in.TenantID, in.OrderID)
	if err != nil {
		return err
	}
	key, err := order.With("refund_requests")
	if err != nil {
		return err
	}
	return effects.LockEntityTx(ctx, tx, key)
}

// countSQL counts an order's refunds: in the ledger, or only requested so
// far (their outbox row, through keyed_outbox_refunds_idx).
const countSQL = `SELECT count(*) FROM (
    SELECT refund_id FROM refund_ledger WHERE tenant_id = $1 AND order_id = $2
    UNION
    SELECT payload->>'refund_id' FROM keyed_outbox
    WHERE workflow_type = '` + WorkflowName + `' AND tenant_id = $1 AND payload->>'order_id' = $2) r`

// queuedRefunds reads the order's refund requests in the outbox, oldest
// first.
func queuedRefunds(ctx context.Context, db effects.DB, tenantID, orderID string) ([]Refund, error) {
	rows, err := db.Query(ctx, queuedRefundsSQL, tenantID, orderID)
	if err != nil {
		return nil, fmt.Errorf("list refund requests of order %s/%s: %w", tenantID, orderID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Refund, error) {
		q, err := scanQueued(r)
		if err != nil {
			return Refund{}, err
		}
		return *q, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list refund requests of order %s/%s: %w", tenantID, orderID, err)
	}
	return out, nil
}
