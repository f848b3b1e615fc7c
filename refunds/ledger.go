package refunds

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
)

// Sentinel errors of the ledger.
var (
	// ErrNotFound means the order has no refund with that ID.
	ErrNotFound = errors.New("refund not found")
	// ErrExceedsCharge is wrapped by *ExceedsError.
	ErrExceedsCharge = errors.New("refund exceeds what is left of the charge")
	// ErrConflict means the refund ID is in the ledger with another amount
	// or reason.
	ErrConflict = errors.New("refund exists with different details")
)

// ExceedsError is the refusal of a refund that would take the order's
// refunds beyond its charge. Amounts are in the order's minor units.
type ExceedsError struct {
	AmountMinor, ChargedMinor, RefundedMinor int64
}

func (e *ExceedsError) Error() string {
	return fmt.Sprintf("%s: refund of %d with %d of %d already refunded or in flight leaves %d", ErrExceedsCharge,
		e.AmountMinor, e.RefundedMinor, e.ChargedMinor, e.ChargedMinor-e.RefundedMinor-e.AmountMinor)
}

// Unwrap returns ErrExceedsCharge.
func (e *ExceedsError) Unwrap() error { return ErrExceedsCharge }

// Entry is a row of the refund ledger: one refund event of an order.
type Entry struct {
	TenantID    string    `json:"tenant_id"`
	OrderID     string    `json:"order_id"`
	RefundID    string    `json:"refund_id"`
	AmountMinor int64     `json:"amount_minor"`
	Reason      string    `json:"reason,omitempty"`
	EffectKey   string    `json:"effect_key"`
	CreatedAt   time.Time `json:"created_at"`
}

// Release is a row of refund_releases: the whole of a refund's ledger row
// given back after Stripe refused the refund for good. Code is Stripe's
// refusal code, such as "charge_disputed".
type Release struct {
	TenantID    string    `json:"tenant_id"`
	OrderID     string    `json:"order_id"`
	RefundID    string    `json:"refund_id"`
	AmountMinor int64     `json:"amount_minor"`
	Code        string    `json:"code"`
	EffectKey   string    `json:"effect_key"`
	CreatedAt   time.Time `json:"created_at"`
}

// Ledger reads and appends to refund_ledger, refund_releases and
// refund_stripe_outcomes; it never updates or deletes a row. ReservedTx is
// ledger minus releases; ConfirmedTx the refunds whose Stripe refund is
// recorded.
type Ledger struct {
	db effects.DB
}

// NewLedger returns a Ledger over db. It returns an error if db is nil.
func NewLedger(db effects.DB) (*Ledger, error) {
	if db == nil {
		return nil, errors.New("refunds: NewLedger: db is nil")
	}
	return &Ledger{db: db}, nil
}

// ReserveTx appends e to the ledger in tx, under the order's lock
// (effects.LockEntityTx), unless the order's refunds (ReservedTx, in flight
// included) would exceed chargedMinor, and returns what they hold with e. A
// repeat with the same amount and reason adds nothing. It returns an
// *ExceedsError (ErrExceedsCharge) when e does not fit, ErrTooManyRefunds
// when the ledger holds MaxPerOrder refunds of the order already (a run
// started without RequestTx), ErrConflict when e.RefundID has another amount
// or reason, orders.ErrNotFound for a missing order, and database errors,
// wrapped.
func (l *Ledger) ReserveTx(ctx context.Context, tx pgx.Tx, e Entry, chargedMinor int64) (refundedMinor int64, err error) {
	orderKey, err := orders.OrderKey(e.TenantID, e.OrderID)
	if err != nil {
		return 0, err
	}
	if err := effects.LockEntityTx(ctx, tx, orderKey); err != nil {
		return 0, err
	}
	// One round trip: the order's sum and count, and this refund's row if
	// it is there.
	var sum int64
	var n int
	var ownAmount *int64
	var ownReason *string
	err = tx.QueryRow(ctx, `
SELECT coalesce(sum(amount_minor), 0)::bigint - `+releasedSum+`, count(*),
       max(amount_minor) FILTER (WHERE refund_id = $3),
       max(reason) FILTER (WHERE refund_id = $3)
FROM refund_ledger WHERE tenant_id = $1 AND order_id = $2`, e.TenantID, e.OrderID, e.RefundID).Scan(&sum, &n, &ownAmount, &ownReason)
	if err != nil {
		return 0, fmt.Errorf("sum refunds of order %s/%s: %w", e.TenantID, e.OrderID, err)
	}
	if ownAmount != nil {
		if *ownAmount != e.AmountMinor || *ownReason != e.Reason {
			return 0, fmt.Errorf("reserve refund %s of order %s/%s: %w", e.RefundID, e.TenantID, e.OrderID, ErrConflict)
		}
		return sum, nil
	}
	if n >= MaxPerOrder {
		return 0, fmt.Errorf("reserve refund %s of order %s/%s: %w", e.RefundID, e.TenantID, e.OrderID, ErrTooManyRefunds)
	}
	if sum+e.AmountMinor > chargedMinor {
		return 0, &ExceedsError{AmountMinor: e.AmountMinor, ChargedMinor: chargedMinor, RefundedMinor: sum}
	}
	_, err = tx.Exec(ctx, `
INSERT INTO refund_ledger (tenant_id, order_id, refund_id, amount_minor, reason, effect_key)
VALUES ($1, $2, $3, $4, $5, $6)`, e.TenantID, e.OrderID, e.RefundID, e.AmountMinor, e.Reason, e.EffectKey)
	if err != nil {
		return 0, fmt.Errorf("append refund %s of order %s/%s: %w", e.RefundID, e.TenantID, e.OrderID, err)
	}
	return sum + e.AmountMinor, nil
}

const entryColumns = `tenant_id, order_id, refund_id, amount_minor, reason, effect_key, created_at`

func scanEntry(row pgx.Row) (*Entry, error) {
	var e Entry
	err := row.Scan(&e.TenantID, &e.OrderID, &e.RefundID, &e.AmountMinor, &e.Reason, &e.EffectKey, &e.CreatedAt)
	return &e, err
}

// Get returns the order's refund refundID. It returns an error wrapping
// ErrNotFound when the ledger has no such row.
func (l *Ledger) Get(ctx context.Context, tenantID, orderID, refundID string) (*Entry, error) {
	return get(ctx, l.db, tenantID, orderID, refundID)
}

// GetTx is Get inside the caller's transaction.
func (l *Ledger) GetTx(ctx context.Context, tx pgx.Tx, tenantID, orderID, refundID string) (*Entry, error) {
	return get(ctx, tx, tenantID, orderID, refundID)
}

func get(ctx context.Context, db effects.DB, tenantID, orderID, refundID string) (*Entry, error) {
	e, err := scanEntry(db.QueryRow(ctx, `SELECT `+entryColumns+` FROM refund_ledger
WHERE tenant_id = $1 AND order_id = $2 AND refund_id = $3`, tenantID, orderID, refundID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("refund %s of order %s/%s: %w", refundID, tenantID, orderID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get refund %s of order %s/%s: %w", refundID, tenantID, orderID, err)
	}
	return e, nil
}

// List returns the order's refunds, oldest first.
func (l *Ledger) List(ctx context.Context, tenantID, orderID string) ([]Entry, error) {
	rows, err := l.db.Query(ctx, `SELECT `+entryColumns+` FROM refund_ledger
WHERE tenant_id = $1 AND order_id = $2 ORDER BY created_at, refund_id`, tenantID, orderID)
	if err != nil {
		return nil, fmt.Errorf("list refunds of order %s/%s: %w", tenantID, orderID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Entry, error) {
		e, err := scanEntry(r)
		return *e, err
	})
	if err != nil {
		return nil, fmt.Errorf("list refunds of order %s/%s: %w", tenantID, orderID, err)
	}
	return out, nil
}

// releasedSum is the SQL of what the releases of order $2 of tenant $1 sum
// to, as a bigint.
const releasedSum = `(SELECT coalesce(sum(amount_minor), 0) FROM refund_releases WHERE tenant_id = $1 AND order_id = $2)::bigint`

// ReservedTx returns, in tx, what the order's refunds hold of its charge: the
// ledger's sum minus the releases', in flight or confirmed alike. A new refund
// must fit beside it; what was refunded is ConfirmedTx.
func (l *Ledger) ReservedTx(ctx context.Context, tx pgx.Tx, tenantID, orderID string) (int64, error) {
	var sum int64
	err := tx.QueryRow(ctx, `SELECT coalesce(sum(amount_minor), 0)::bigint - `+releasedSum+` FROM refund_ledger
WHERE tenant_id = $1 AND order_id = $2`, tenantID, orderID).Scan(&sum)
	if err != nil {
		return 0, fmt.Errorf("sum refunds of order %s/%s: %w", tenantID, orderID, err)
	}
	return sum, nil
}

// ConfirmedTx returns, in tx, what the order has refunded: the sum of the
// refunds whose Stripe refund is recorded. The sum only grows. It returns the
// database error, wrapped.
func (l *Ledger) ConfirmedTx(ctx context.Context, tx pgx.Tx, tenantID, orderID string) (int64, error) {
	var sum int64
	err := tx.QueryRow(ctx, `SELECT coalesce(sum(amount_minor), 0)::bigint FROM refund_stripe_outcomes
WHERE tenant_id = $1 AND order_id = $2`, tenantID, orderID).Scan(&sum)
	if err != nil {
		return 0, fmt.Errorf("sum confirmed refunds of order %s/%s: %w", tenantID, orderID, err)
	}
	return sum, nil
}

// RecordStripe stores what Stripe answered to the refund, once: a repeat
// keeps the first row. It returns the database error, wrapped.
func (l *Ledger) RecordStripe(ctx context.Context, e *Entry, r StripeResult, effectKey string) error {
	_, err := l.db.Exec(ctx, `
INSERT INTO refund_stripe_outcomes (tenant_id, order_id, refund_id, stripe_refund_id, payment_intent_id, status, amount_minor, currency, effect_key)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT DO NOTHING`, e.TenantID, e.OrderID, e.RefundID, r.RefundID, r.PaymentIntentID, r.Status, r.AmountMinor, r.Currency, effectKey)
	if err != nil {
		return fmt.Errorf("record Stripe refund %s of order %s/%s: %w", r.RefundID, e.TenantID, e.OrderID, err)
	}
	return nil
}

// StripeOutcome returns the recorded Stripe outcome of the refund, or
// found=false when none is recorded. It returns the database error, wrapped.
func (l *Ledger) StripeOutcome(ctx context.Context, tenantID, orderID, refundID string) (r StripeResult, found bool, err error) {
	return l.stripeOutcome(ctx, l.db, tenantID, orderID, refundID)
}

// StripeOutcomeTx is StripeOutcome inside the caller's transaction.
func (l *Ledger) StripeOutcomeTx(ctx context.Context, tx pgx.Tx, tenantID, orderID, refundID string) (r StripeResult, found bool, err error) {
	return l.stripeOutcome(ctx, tx, tenantID, orderID, refundID)
}

func (l *Ledger) stripeOutcome(ctx context.Context, db effects.DB, tenantID, orderID, refundID string) (r StripeResult, found bool, err error) {
	_, r, err = scanStripe(db.QueryRow(ctx, `SELECT `+stripeColumns+` FROM refund_stripe_outcomes
WHERE tenant_id = $1 AND order_id = $2 AND refund_id = $3`, tenantID, orderID, refundID))
	if errors.Is(err, pgx.ErrNoRows) {
		return StripeResult{}, false, nil
	}
	if err != nil {
		return StripeResult{}, false, fmt.Errorf("read Stripe refund of %s of order %s/%s: %w", refundID, tenantID, orderID, err)
	}
	return r, true, nil
}

// stripeColumns are what scanStripe reads of a refund_stripe_outcomes row.
const stripeColumns = `refund_id, stripe_refund_id, payment_intent_id, status, amount_minor, currency`

// scanStripe reads stripeColumns: the refund's ID and Stripe's answer.
func scanStripe(row pgx.Row) (refundID string, r StripeResult, err error) {
	err = row.Scan(&refundID, &r.RefundID, &r.PaymentIntentID, &r.Status, &r.AmountMinor, &r.Currency)
	return refundID, r, err
}

// ErrRefunded means Stripe's refund of the refund is recorded: its
// reservation holds money that went out and cannot be released.
var ErrRefunded = errors.New("refund was made at Stripe")

// ReleaseTx appends r to refund_releases in tx, for the refund's whole amount,
// under the order's lock, and returns the release as stored and ReservedTx
// after it; a repeat returns the stored release. It returns an error wrapping
// ErrNotFound when the refund is not in the ledger, ErrRefunded when its
// Stripe refund is recorded, and database errors, wrapped.
func (l *Ledger) ReleaseTx(ctx context.Context, tx pgx.Tx, r Release) (Release, int64, error) {
	orderKey, err := orders.OrderKey(r.TenantID, r.OrderID)
	if err != nil {
		return Release{}, 0, err
	}
	if err := effects.LockEntityTx(ctx, tx, orderKey); err != nil {
		return Release{}, 0, err
	}
	stored, err := released(ctx, tx, r.TenantID, r.OrderID, r.RefundID)
	if err != nil || stored != nil {
		return l.withRefunded(ctx, tx, stored, err)
	}
	e, err := l.GetTx(ctx, tx, r.TenantID, r.OrderID, r.RefundID)
	if err != nil {
		return Release{}, 0, err
	}
	if _, found, err := l.StripeOutcomeTx(ctx, tx, r.TenantID, r.OrderID, r.RefundID); err != nil || found {
		if err == nil {
			err = fmt.Errorf("release refund %s of order %s/%s: %w", r.RefundID, r.TenantID, r.OrderID, ErrRefunded)
		}
		return Release{}, 0, err
	}
	r.AmountMinor = e.AmountMinor
	err = tx.QueryRow(ctx, `
INSERT INTO refund_releases (tenant_id, order_id, refund_id, amount_minor, code, effect_key)
VALUES ($1, $2, $3, $4, $5, $6) RETURNING created_at`, r.TenantID, r.OrderID, r.RefundID, r.AmountMinor, r.Code, r.EffectKey).Scan(&r.CreatedAt)
	if err != nil {
		return Release{}, 0, fmt.Errorf("release refund %s of order %s/%s: %w", r.RefundID, r.TenantID, r.OrderID, err)
	}
	return l.withRefunded(ctx, tx, &r, nil)
}

// withRefunded returns *r with what r's order has refunded, or err.
func (l *Ledger) withRefunded(ctx context.Context, tx pgx.Tx, r *Release, err error) (Release, int64, error) {
	if err != nil {
		return Release{}, 0, err
	}
	refunded, err := l.ReservedTx(ctx, tx, r.TenantID, r.OrderID)
	return *r, refunded, err
}

// Released returns the release of the order's refund refundID, or nil when
// it was not released. It returns the database error, wrapped.
func (l *Ledger) Released(ctx context.Context, tenantID, orderID, refundID string) (*Release, error) {
	return released(ctx, l.db, tenantID, orderID, refundID)
}

func released(ctx context.Context, db effects.DB, tenantID, orderID, refundID string) (*Release, error) {
	r, err := scanRelease(db.QueryRow(ctx, `SELECT `+releaseColumns+` FROM refund_releases
WHERE tenant_id = $1 AND order_id = $2 AND refund_id = $3`, tenantID, orderID, refundID), tenantID, orderID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read release of refund %s of order %s/%s: %w", refundID, tenantID, orderID, err)
	}
	return r, nil
}

// releaseColumns are what scanRelease reads of a refund_releases row.
const releaseColumns = `refund_id, amount_minor, code, effect_key, created_at`

// scanRelease reads releaseColumns of a release of tenantID's order orderID.
func scanRelease(row pgx.Row, tenantID, orderID string) (*Release, error) {
	r := Release{TenantID: tenantID, OrderID: orderID}
	err := row.Scan(&r.RefundID, &r.AmountMinor, &r.Code, &r.EffectKey, &r.CreatedAt)
	return &r, err
}
