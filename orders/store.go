// Package orders is the order domain: the orders table, its state
// transitions, and the identifiers and inputs that the order workflow, its
// activities and its starters share.
package orders

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/step"
)

// Status is an order's status.
type Status string

// Order statuses.
const (
	StatusPending Status = "pending"
	StatusPaid    Status = "paid"
	StatusFailed  Status = "failed"
)

// Sentinel errors of the order store.
var (
	// ErrNotFound means the tenant has no order with that ID.
	ErrNotFound = step.Sentinel(step.ErrNotFound, "order not found")
	// ErrConflict means an order with that ID exists with other details.
	ErrConflict = errors.New("order exists with different details")
	// ErrInvalid is wrapped by *ValidationError.
	ErrInvalid = step.Sentinel(step.ErrInvalidInput, "invalid order")
	// ErrBadTransition means the order is not in the state a transition needs.
	ErrBadTransition = step.Sentinel(step.ErrInvalidState, "order is not in the required state")
	// ErrUnguarded means a Transition's guard did not hold.
	ErrUnguarded = step.Sentinel(step.ErrInvalidState, "the transition's guard does not hold")
	// ErrFinal means the order failed for good (its charge was declined or
	// left incomplete). A failed order is final: no run, command or API call
	// charges it again, and its stored outcome is never overwritten. To
	// charge another payment method, create a new order.
	ErrFinal = errors.New("a failed order is final; create a new order to charge another payment method")
)

// ValidationError names the field of a NewOrder that is invalid.
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("%s: %s: %s", ErrInvalid, e.Field, e.Reason)
}

// Unwrap returns ErrInvalid.
func (e *ValidationError) Unwrap() error { return ErrInvalid }

// CheckRunnable returns an error wrapping ErrFinal, naming the order, if o
// failed; a pending or paid order may be (re)started, a paid one replaying
// its stored outcomes.
func (o *Order) CheckRunnable() error {
	if o.Status == StatusFailed {
		return fmt.Errorf("order %s/%s is failed: %w", o.TenantID, o.ID, ErrFinal)
	}
	return nil
}

// Order is a row of the orders table.
type Order struct {
	TenantID      string    `json:"tenant_id"`
	ID            string    `json:"id"`
	AmountMinor   int64     `json:"amount_minor"`
	Currency      string    `json:"currency"`
	CustomerEmail string    `json:"customer_email"`
	PaymentMethod string    `json:"payment_method"`
	Status        Status    `json:"status"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// NewOrder is what it takes to create an order.
type NewOrder struct {
	TenantID      string `json:"-"`
	ID            string `json:"order_id"`
	AmountMinor   int64  `json:"amount_minor"`
	Currency      string `json:"currency"`
	CustomerEmail string `json:"customer_email"`
	PaymentMethod string `json:"payment_method"`
}

// Currencies lists the ISO 4217 codes keyed accepts, lower case as Stripe
// writes them. Extend it when a new market opens.
var Currencies = map[string]bool{
	"usd": true, "eur": true, "gbp": true, "chf": true, "jpy": true, "cad": true,
	"aud": true, "sek": true, "nok": true, "dkk": true, "pln": true, "nzd": true,
}

var paymentMethodRE = regexp.MustCompile(`^pm_[A-Za-z0-9_]{1,100}$`)

// Validate returns a *ValidationError naming the first invalid field. The
// customer email must pass ValidateEmail.
func (o NewOrder) Validate() error {
	if _, err := effects.NewKey(o.TenantID, "x"); err != nil {
		return &ValidationError{Field: "tenant_id", Reason: strings.TrimPrefix(err.Error(), effects.ErrInvalidKey.Error()+": ")}
	}
	if reason := CheckID(o.ID); reason != "" {
		return &ValidationError{Field: "order_id", Reason: reason}
	}
	// Its refunds' keys are the longest of an order's: if they fit, every
	// step's does.
	prefix := len(o.TenantID) + len(effects.Separator+"order"+effects.Separator)
	if most := effects.MaxKeyLen - RefundKeyRoom - prefix; len(o.ID) > most {
		if most < 1 {
			return &ValidationError{Field: "tenant_id", Reason: fmt.Sprintf("%d bytes, too long for orders: an order's refunds would have effect keys over %d bytes", len(o.TenantID), effects.MaxKeyLen)}
		}
		return &ValidationError{Field: "order_id", Reason: fmt.Sprintf("%d bytes, too long for this tenant: its refunds would have effect keys over %d bytes; at most %d bytes here",
			len(o.ID), effects.MaxKeyLen, most)}
	}
	if o.AmountMinor <= 0 {
		return &ValidationError{Field: "amount_minor", Reason: fmt.Sprintf("%d is not a positive amount in minor units", o.AmountMinor)}
	}
	if o.AmountMinor > 99_999_999 {
		return &ValidationError{Field: "amount_minor", Reason: "above the 99999999 Stripe accepts"}
	}
	if !Currencies[o.Currency] {
		return &ValidationError{Field: "currency", Reason: fmt.Sprintf("%.16q is not a supported lower-case ISO 4217 code", o.Currency)}
	}
	if err := ValidateEmail(o.CustomerEmail); err != nil {
		return err
	}
	if !paymentMethodRE.MatchString(o.PaymentMethod) {
		return &ValidationError{Field: "payment_method", Reason: "want a Stripe payment method ID such as pm_card_visa"}
	}
	return nil
}

// Store reads and writes orders.
type Store struct {
	db effects.DB
}

// NewStore returns a Store over db. It returns an error if db is nil.
func NewStore(db effects.DB) (*Store, error) {
	if db == nil {
		return nil, errors.New("orders: NewStore: db is nil")
	}
	return &Store{db: db}, nil
}

// Create inserts the order, or returns an identical existing one with
// created=false. It returns an error wrapping ErrConflict when the existing
// order differs, and a *ValidationError for bad input.
func (s *Store) Create(ctx context.Context, o NewOrder) (*Order, bool, error) {
	return create(ctx, s.db, o)
}

// CreateTx is Create inside the caller's transaction.
func (s *Store) CreateTx(ctx context.Context, tx pgx.Tx, o NewOrder) (*Order, bool, error) {
	return create(ctx, tx, o)
}

const orderColumns = `tenant_id, id, amount_minor, currency, customer_email, payment_method, status, created_at, updated_at`

func scanOrder(row pgx.Row) (*Order, error) {
	var o Order
	err := row.Scan(&o.TenantID, &o.ID, &o.AmountMinor, &o.Currency, &o.CustomerEmail, &o.PaymentMethod, &o.Status, &o.CreatedAt, &o.UpdatedAt)
	return &o, err
}

func create(ctx context.Context, db effects.DB, o NewOrder) (*Order, bool, error) {
	if err := o.Validate(); err != nil {
		return nil, false, err
	}
	got, err := scanOrder(db.QueryRow(ctx, `
INSERT INTO orders (tenant_id, id, amount_minor, currency, customer_email, payment_method)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant_id, id) DO NOTHING
RETURNING `+orderColumns, o.TenantID, o.ID, o.AmountMinor, o.Currency, o.CustomerEmail, o.PaymentMethod))
	if err == nil {
		return got, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, false, fmt.Errorf("create order %s/%s: %w", o.TenantID, o.ID, err)
	}
	existing, err := get(ctx, db, o.TenantID, o.ID)
	if err != nil {
		return nil, false, err
	}
	if existing.AmountMinor != o.AmountMinor || existing.Currency != o.Currency ||
		existing.CustomerEmail != o.CustomerEmail || existing.PaymentMethod != o.PaymentMethod {
		return nil, false, fmt.Errorf("create order %s/%s: %w", o.TenantID, o.ID, ErrConflict)
	}
	return existing, false, nil
}

// Get returns the tenant's order. It returns an error wrapping ErrNotFound
// when there is none.
func (s *Store) Get(ctx context.Context, tenantID, id string) (*Order, error) {
	return get(ctx, s.db, tenantID, id)
}

// GetTx is Get inside the caller's transaction.
func (s *Store) GetTx(ctx context.Context, tx pgx.Tx, tenantID, id string) (*Order, error) {
	return get(ctx, tx, tenantID, id)
}

func get(ctx context.Context, db effects.DB, tenantID, id string) (*Order, error) {
	o, err := scanOrder(db.QueryRow(ctx, `SELECT `+orderColumns+` FROM orders WHERE tenant_id = $1 AND id = $2`, tenantID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("order %s/%s: %w", tenantID, id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get order %s/%s: %w", tenantID, id, err)
	}
	return o, nil
}

// TransitionTx moves the order from one status to another for eventID in tx,
// recording the transition under a unique (order, from, to, event): a repeat
// returns changed=false. It returns an error wrapping ErrBadTransition if the
// order is in another state, and ErrNotFound if it does not exist.
func (s *Store) TransitionTx(ctx context.Context, tx pgx.Tx, tenantID, id string, from, to Status, eventID string) (changed bool, err error) {
	// One round trip: the update runs only when the transition row was
	// inserted. Both see one snapshot, and the order's row lock orders
	// racers as two statements would.
	var inserted, updated bool
	err = tx.QueryRow(ctx, `
WITH ins AS (
	INSERT INTO order_transitions (tenant_id, order_id, from_state, to_state, event_id)
	VALUES ($1, $2, $3, $4, $5)
	ON CONFLICT DO NOTHING
	RETURNING 1
), upd AS (
	UPDATE orders SET status = $4, updated_at = now()
	WHERE tenant_id = $1 AND id = $2 AND status = $3 AND EXISTS (SELECT FROM ins)
	RETURNING 1
)
SELECT EXISTS (SELECT FROM ins), EXISTS (SELECT FROM upd)`, tenantID, id, from, to, eventID).Scan(&inserted, &updated)
	switch {
	case err != nil && strings.Contains(err.Error(), "foreign key"):
		return false, fmt.Errorf("transition order %s/%s: %w", tenantID, id, ErrNotFound)
	case err != nil:
		return false, fmt.Errorf("transition order %s/%s: %w", tenantID, id, err)
	case !inserted:
		return false, nil
	case !updated:
		return false, fmt.Errorf("transition order %s/%s %s->%s: %w", tenantID, id, from, to, ErrBadTransition)
	}
	return true, nil
}

// Guard is a SQL condition that must hold for a Transition to happen, such
// as effects.SucceededSQL(6, "charge"), with Arg as its parameter $6.
type Guard struct {
	SQL string
	Arg any
}

// Transition moves the order from one status to another for eventID in one
// statement, outside any transaction, when guard (nil: none) holds: the
// order's update and its transition row commit together or not at all. A
// repeat, the order already moved to `to` under eventID, returns
// changed=false whether guard holds or not. It returns an error wrapping
// ErrNotFound if the order does not exist, ErrUnguarded if guard does not
// hold, and ErrBadTransition if the order is in another state.
func (s *Store) Transition(ctx context.Context, tenantID, id string, from, to Status, eventID string, guard *Guard) (changed bool, err error) {
	cond, args := "true", []any{tenantID, id, from, to, eventID}
	if guard != nil {
		cond, args = "("+guard.SQL+")", append(args, guard.Arg)
	}
	// The update goes first and the row is inserted only with it; a racer
	// on the same event waits for the order's row lock and updates nothing.
	var before, found, guarded bool
	err = s.db.QueryRow(ctx, `
WITH g AS (SELECT `+cond+` AS ok), upd AS (
	UPDATE orders SET status = $4, updated_at = now()
	WHERE tenant_id = $1 AND id = $2 AND status = $3 AND (SELECT ok FROM g)
	RETURNING 1
), ins AS (
	INSERT INTO order_transitions (tenant_id, order_id, from_state, to_state, event_id)
	SELECT $1, $2, $3, $4, $5 FROM upd
	RETURNING 1
)
SELECT EXISTS (SELECT FROM ins), EXISTS (SELECT FROM order_transitions
	WHERE tenant_id = $1 AND order_id = $2 AND from_state = $3 AND to_state = $4 AND event_id = $5),
	EXISTS (SELECT FROM orders WHERE tenant_id = $1 AND id = $2), (SELECT ok FROM g)`,
		args...).Scan(&changed, &before, &found, &guarded)
	switch {
	case err != nil:
		return false, fmt.Errorf("transition order %s/%s: %w", tenantID, id, err)
	case changed:
		return true, nil
	case before:
		return false, nil // a repeat
	case !found:
		return false, fmt.Errorf("transition order %s/%s: %w", tenantID, id, ErrNotFound)
	case !guarded:
		return false, fmt.Errorf("transition order %s/%s %s->%s: %w", tenantID, id, from, to, ErrUnguarded)
	}
	// No transition under eventID in the statement's snapshot: the order is
	// elsewhere, or a racer's transition committed since, which a fresh
	// snapshot sees.
	moved, err := s.MovedTo(ctx, tenantID, id, eventID, to)
	switch {
	case err != nil:
		return false, err
	case moved:
		return false, nil
	}
	o, err := get(ctx, s.db, tenantID, id)
	if err != nil {
		return false, fmt.Errorf("transition order %s/%s: %w", tenantID, id, err)
	}
	return false, fmt.Errorf("transition order %s/%s %s->%s: the order is %s: %w", tenantID, id, from, to, o.Status, ErrBadTransition)
}

// MovedTo reports whether the order's latest transition under eventID went
// to `to`.
func (s *Store) MovedTo(ctx context.Context, tenantID, id, eventID string, to Status) (bool, error) {
	got, found, err := eventTransition(ctx, s.db, tenantID, id, eventID)
	return found && got == to, err
}
