// Package activities holds the order pipeline's Temporal activities: Charge,
// MarkPaid, SendReceipt and, after a terminal charge failure, MarkFailed.
// Each makes one side effect exactly once across Temporal's at-least-once
// execution, by claiming its own effect key (see package effects) and, for
// providers, sending that key along.
//
// Each activity is declared once, as a Keyed[T] (DeclCharge, DeclMarkPaid,
// DeclSendReceipt, DeclMarkFailed): name, effect class, key step, delivery
// policy for a send, activity options. Keyed.Run does what every keyed
// activity repeats: it validates the versioned orders.OrderInput, loads
// the order's current row, derives the effect key from the declared step
// (in.EffectKey(step)) and claims it with the owner "<workflow ID>/<step>",
// so that a later attempt of the same step re-enters its own claim at once
// while any other owner waits for the lease; it heartbeats while the effect
// runs and returns errors through ToTemporal: transient ones retryable,
// everything else non-retryable with a stable type (the ErrType constants).
//
// Activities are registered through Register, which accepts only
// Definitions whose Declaration is valid: adding a keyed activity means
// declaring it (see README, "Adding a keyed activity").
package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	stripeclient "github.com/stripe/stripe-go/v76/client"
	"go.temporal.io/sdk/activity"

	"github.com/keyedhq/keyed/effects"
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
	claims *effects.Client
	orders *orders.Store
	stripe *stripeclient.API
	sender *notify.Sender
	logger *slog.Logger
	check  *checker
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
	return &Activities{db: d.DB, claims: d.Effects, orders: d.Orders, stripe: d.Stripe, sender: d.Sender, logger: logger,
		check: &checker{CheckDeps{DB: d.DB, Orders: d.Orders, Stripe: d.Stripe, Sender: d.Sender}}}, nil
}

// The order pipeline's activities, declared once: their names, effect
// classes, key steps, the rule for an operator's "done" outcome (from the
// outcome type) and, for the receipt, its delivery policy. Definitions
// binds them to an *Activities; the workflow runs them by these
// declarations.
var (
	DeclCharge      = Declare[orders.ChargeResult](Declaration{Name: NameCharge, Class: effects.ClassExternalCreate, Step: orders.StepCharge})
	DeclMarkPaid    = Declare[orders.MarkPaidResult](Declaration{Name: NameMarkPaid, Class: effects.ClassAbsoluteWrite, Step: orders.StepMarkPaid})
	DeclSendReceipt = Declare[orders.ReceiptResult](Declaration{Name: NameSendReceipt, Class: effects.ClassIrreversibleSend,
		Step: orders.StepReceipt, Policy: notify.AtMostOnce})
	DeclMarkFailed = Declare[orders.MarkFailedResult](Declaration{Name: NameMarkFailed, Class: effects.ClassAbsoluteWrite, Step: orders.StepMarkFailed})
)

// Definitions returns the order pipeline's activities bound to a, for
// Register, each with the Verify of an operator's "done" outcome (see
// Checks) for pipeline.NewDecider. A nil a is good for naming them, and
// verifies nothing.
func (a *Activities) Definitions() []Definition {
	defs := []Definition{
		DeclCharge.Bind(a.Charge),
		DeclMarkPaid.Bind(a.MarkPaid),
		DeclSendReceipt.Bind(a.SendReceipt),
		DeclMarkFailed.Bind(a.MarkFailed),
	}
	if a != nil {
		a.check.bind(defs)
	}
	return defs
}

// Declarations returns the declarations of the order pipeline's
// activities, in the order of Definitions.
func Declarations() []Declaration {
	var a *Activities
	defs := a.Definitions()
	out := make([]Declaration, len(defs))
	for i, d := range defs {
		out[i] = d.Declaration
	}
	return out
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
