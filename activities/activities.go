// Package activities holds the order pipeline's Temporal activities: Charge,
// MarkPaid, SendReceipt and, after a terminal charge failure, MarkFailed.
// Each makes one side effect exactly once across Temporal's at-least-once
// execution, by claiming its own effect key (see package effects) and, for
// providers, sending that key along.
//
// Every activity takes the versioned orders.CheckoutInput, loads the order's
// current row, derives its effect key from the input (in.EffectKey(step))
// and claims it with the owner "<workflow ID>/<step>", so that a later
// attempt of the same step re-enters its own claim at once while any other
// owner waits for the lease. Errors reach Temporal through ToTemporal:
// transient ones retryable, everything else non-retryable with a stable
// type (the ErrType constants).
//
// Activities are registered through Register, which accepts only
// Definitions that declare an effect class and an effect-key step: adding a
// keyed activity means adding a Definition.
package activities

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	stripeclient "github.com/stripe/stripe-go/v76/client"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/worker"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/tracing"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
)

// Registered activity names.
const (
	NameCharge      = "Charge"
	NameMarkPaid    = "MarkPaid"
	NameSendReceipt = "SendReceipt"
	NameMarkFailed  = "MarkFailed"
)

// RecordHorizon is how long ago an order must have changed before a step
// treats its new claim as possibly a pruned one and asks the provider first
// (Charge searches Stripe by metadata, SendReceipt looks the key up at
// SendGrid). It is Stripe's idempotency window, 24 hours, and well below the
// shortest effects retention the worker accepts (the namespace's retention
// plus the longest run), so the look-up costs only steps of old orders.
const RecordHorizon = 24 * time.Hour

// ReceiptTemplate is the notify template of the receipt email.
const ReceiptTemplate = "receipt"

// Deps is what the activities need. Every field is required except Logger.
type Deps struct {
	DB      *pgxpool.Pool
	Effects *effects.Client
	Orders  *orders.Store
	Stripe  *stripeclient.API
	Sender  *notify.Sender
	// Logger receives one record per step outcome. Nil means slog.Default().
	Logger *slog.Logger
}

// Activities implements the order pipeline's activities. A nil
// *Activities is only good for naming them in workflow.ExecuteActivity.
type Activities struct {
	db     *pgxpool.Pool
	fx     *effects.Client
	orders *orders.Store
	stripe *stripeclient.API
	sender *notify.Sender
	logger *slog.Logger
}

// New returns Activities over d. It returns an error naming the first
// missing dependency.
func New(d Deps) (*Activities, error) {
	switch {
	case d.DB == nil:
		return nil, errors.New("activities: New: DB is nil")
	case d.Effects == nil:
		return nil, errors.New("activities: New: Effects is nil")
	case d.Orders == nil:
		return nil, errors.New("activities: New: Orders is nil")
	case d.Stripe == nil || d.Stripe.PaymentIntents == nil:
		return nil, errors.New("activities: New: Stripe is nil")
	case d.Sender == nil:
		return nil, errors.New("activities: New: Sender is nil")
	}
	logger := d.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &Activities{db: d.DB, fx: d.Effects, orders: d.Orders, stripe: d.Stripe, sender: d.Sender, logger: logger}, nil
}

// Definition declares a keyed activity: its registered name, the effect
// class of its side effect, the step of its effect key, and the function.
type Definition struct {
	Name  string
	Class effects.Class
	Step  string
	Fn    any
}

// Definitions returns the order pipeline's activities bound to a.
func (a *Activities) Definitions() []Definition {
	return []Definition{
		{Name: NameCharge, Class: effects.ClassExternalCreate, Step: orders.StepCharge, Fn: a.Charge},
		{Name: NameMarkPaid, Class: effects.ClassAbsoluteWrite, Step: orders.StepMarkPaid, Fn: a.MarkPaid},
		{Name: NameSendReceipt, Class: effects.ClassIrreversibleSend, Step: orders.StepReceipt, Fn: a.SendReceipt},
		{Name: NameMarkFailed, Class: effects.ClassAbsoluteWrite, Step: orders.StepMarkFailed, Fn: a.MarkFailed},
	}
}

// Register registers each definition with r under its Name. It checks all
// of them first and registers none if one has an empty Name, an invalid
// Class, an empty Step, a Fn that is not a function, or a Name used twice:
// an activity whose effect has not been classified does not run.
func Register(r worker.ActivityRegistry, defs ...Definition) error {
	if r == nil {
		return errors.New("activities: Register: registry is nil")
	}
	seen := map[string]bool{}
	for i, d := range defs {
		var problem string
		switch {
		case d.Name == "":
			problem = "has no Name"
		case !d.Class.Valid():
			problem = fmt.Sprintf("has effect class %q; declare one of %s, %s, %s, %s", d.Class,
				effects.ClassAbsoluteWrite, effects.ClassRelativeWrite, effects.ClassExternalCreate, effects.ClassIrreversibleSend)
		case d.Step == "":
			problem = "has no effect key Step"
		case d.Fn == nil || reflect.TypeOf(d.Fn).Kind() != reflect.Func:
			problem = "has no function"
		case seen[d.Name]:
			problem = "is declared twice"
		}
		if problem != "" {
			return fmt.Errorf("activities: Register: definition %d %q %s", i, d.Name, problem)
		}
		seen[d.Name] = true
	}
	for _, d := range defs {
		r.RegisterActivityWithOptions(d.Fn, activity.RegisterOptions{Name: d.Name})
	}
	return nil
}

// run is one step's context: the order (nil until loaded), its effect key
// and the claim owner.
type run struct {
	step  string
	in    orders.CheckoutInput
	order *orders.Order
	key   effects.Key
	owner string
	log   *slog.Logger
}

// begin is prepare, then loads the order. Errors: prepare's, order not
// found, or a database failure.
func (a *Activities) begin(ctx context.Context, in orders.CheckoutInput, step string) (*run, error) {
	r, err := a.prepare(ctx, in, step)
	if err != nil {
		return nil, err
	}
	if r.order, err = a.orders.Get(ctx, in.TenantID, in.OrderID); err != nil {
		return nil, loadOrderError(r, err)
	}
	return r, nil
}

func loadOrderError(r *run, err error) error {
	return fmt.Errorf("%s %s: load order: %w", r.step, r.key, err)
}

// prepare validates in and derives the step's effect key and owner, without
// touching the database. Errors: invalid input, or no workflow in the
// activity info.
func (a *Activities) prepare(ctx context.Context, in orders.CheckoutInput, step string) (*run, error) {
	if err := in.Validate(); err != nil {
		return nil, fmt.Errorf("%s: check input: %w", step, err)
	}
	key, err := in.EffectKey(step)
	if err != nil {
		return nil, fmt.Errorf("%s: derive effect key: %w", step, err)
	}
	// The activity's span (when tracing) names the key, and so is the
	// parent of the provider calls the step makes.
	tracing.SetEffectKey(ctx, key.String())
	wfID := activity.GetInfo(ctx).WorkflowExecution.ID
	if wfID == "" {
		return nil, &Error{Type: ErrTypeInvalidInput, kind: ErrInvalidInput,
			Message: fmt.Sprintf("%s %s: not started by a workflow; the claim owner is the workflow ID", step, key)}
	}
	r := &run{step: step, in: in, key: key, owner: wfID + "/" + step}
	r.log = a.logger.With("effect_key", key.String(), "step", step, "tenant_id", in.TenantID, "order_id", in.OrderID)
	return r, nil
}

// heartbeat records a Temporal heartbeat; effects.Do calls it after every
// lease renewal, so a heartbeat means "alive and still owning the claim".
func heartbeat(ctx context.Context) { activity.RecordHeartbeat(ctx) }

// heartbeatEvery renews the lease (and heartbeats) three times per heartbeat
// timeout, or at Do's default when the activity has none.
func heartbeatEvery(ctx context.Context) time.Duration {
	hb := activity.GetInfo(ctx).HeartbeatTimeout
	if hb <= 0 {
		return 0
	}
	return max(hb/3, 100*time.Millisecond)
}

// fingerprint hashes a step's deterministic inputs for effects.ClaimParams.
func fingerprint(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return "sha256:" + hex.EncodeToString(h[:16])
}

// zeroDecimal lists Stripe's zero-decimal currencies: their minor unit is
// the whole unit.
var zeroDecimal = map[string]bool{
	"bif": true, "clp": true, "djf": true, "gnf": true, "jpy": true, "kmf": true, "krw": true, "mga": true,
	"pyg": true, "rwf": true, "ugx": true, "vnd": true, "vuv": true, "xaf": true, "xof": true, "xpf": true,
}

// FormatAmount renders an amount in minor units for people: 1250 "eur" is
// "12.50 EUR", 1250 "jpy" is "1250 JPY".
func FormatAmount(minor int64, currency string) string {
	cur := strings.ToUpper(currency)
	if zeroDecimal[strings.ToLower(currency)] {
		return strconv.FormatInt(minor, 10) + " " + cur
	}
	sign := ""
	if minor < 0 {
		sign, minor = "-", -minor
	}
	return fmt.Sprintf("%s%d.%02d %s", sign, minor/100, minor%100, cur)
}
