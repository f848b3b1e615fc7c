package refunds

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	stripeclient "github.com/stripe/stripe-go/v76/client"
	"go.temporal.io/sdk/activity"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
)

// Registered activity names.
const (
	NameReserve         = "RefundReserve"
	NameRefundAtStripe  = "RefundAtStripe"
	NameMarkRefunded    = "MarkRefunded"
	NameSendRefundEmail = "SendRefundEmail"
)

// EmailTemplate is the notify template of the refund email. Its delivery
// policy is the Sender's for this template (notify.SenderOpts.Policies), at
// most once unless configured otherwise.
const EmailTemplate = "refund"

// The refund workflow's activities, declared once: names, effect classes,
// key steps and, for the email, its delivery policy. The workflow takes
// each step's Temporal options from its declaration.
var (
	DeclReserve = activities.Declaration{Name: NameReserve, Class: effects.ClassAbsoluteWrite, Step: StepReserve}
	DeclStripe  = activities.Declaration{Name: NameRefundAtStripe, Class: effects.ClassExternalCreate, Step: StepStripe}
	DeclMark    = activities.Declaration{Name: NameMarkRefunded, Class: effects.ClassAbsoluteWrite, Step: StepMark}
	DeclEmail   = activities.Declaration{Name: NameSendRefundEmail, Class: effects.ClassIrreversibleSend, Step: StepEmail,
		Policy: notify.AtMostOnce}
)

// Deps is what the refund activities need. Every field is required except
// Logger. Stripe must have its PaymentIntents and Refunds clients (as
// activities.NewStripeClient's has).
type Deps struct {
	DB      *pgxpool.Pool
	Effects *effects.Client
	Orders  *orders.Store
	Stripe  *stripeclient.API
	Sender  *notify.Sender
	// Logger receives one record per step outcome. Nil means slog.Default().
	Logger *slog.Logger
}

// Activities implements the refund workflow's activities. A nil
// *Activities is only good for naming them.
type Activities struct {
	db     *pgxpool.Pool
	claims *effects.Client
	orders *orders.Store
	ledger *Ledger
	stripe *stripeclient.API
	sender *notify.Sender
	logger *slog.Logger
}

// New returns Activities over d. It returns an error naming the first
// missing dependency.
func New(d Deps) (*Activities, error) {
	switch {
	case d.DB == nil:
		return nil, errors.New("refunds: New: DB is nil")
	case d.Effects == nil:
		return nil, errors.New("refunds: New: Effects is nil")
	case d.Orders == nil:
		return nil, errors.New("refunds: New: Orders is nil")
	case d.Stripe == nil || d.Stripe.Refunds == nil:
		return nil, errors.New("refunds: New: Stripe is nil or has no Refunds client")
	case d.Sender == nil:
		return nil, errors.New("refunds: New: Sender is nil")
	}
	ledger, err := NewLedger(d.DB)
	if err != nil {
		return nil, err
	}
	logger := d.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &Activities{db: d.DB, claims: d.Effects, orders: d.Orders, ledger: ledger, stripe: d.Stripe, sender: d.Sender, logger: logger}, nil
}

// Definitions returns the refund activities bound to a, for
// activities.Register. A nil a is good for naming them.
func (a *Activities) Definitions() []activities.Definition {
	return []activities.Definition{
		DeclReserve.Bind(a.Reserve),
		DeclStripe.Bind(a.RefundAtStripe),
		DeclMark.Bind(a.MarkRefunded),
		DeclEmail.Bind(a.SendRefundEmail),
	}
}

// call is one run of a refund activity: its input, effect key, claim owner
// and logger.
type call struct {
	in    RefundInput
	key   effects.Key
	owner string
	step  string
	log   *slog.Logger
	every time.Duration // how often to renew the lease and heartbeat
}

// run validates in, derives d's effect key and the claim owner
// ("<workflow ID>/<step>"), runs fn, logs its outcome and returns its error
// through activities.ToTemporal.
func run[T any](ctx context.Context, a *Activities, d activities.Declaration, in RefundInput, fn func(context.Context, *call) (T, error)) (T, error) {
	var zero T
	c, err := a.prepare(ctx, in, d.Step)
	if err != nil {
		return zero, activities.ToTemporal(err)
	}
	res, err := fn(ctx, c)
	if err != nil {
		c.log.WarnContext(ctx, "step failed", "error", err)
		return zero, activities.ToTemporal(err)
	}
	c.log.InfoContext(ctx, "step done", "outcome", res)
	return res, nil
}

func (a *Activities) prepare(ctx context.Context, in RefundInput, step string) (*call, error) {
	if err := in.Validate(); err != nil {
		return nil, fmt.Errorf("%s: check input: %w", step, err)
	}
	key, err := in.EffectKey(step)
	if err != nil {
		return nil, fmt.Errorf("%s: derive effect key: %w", step, err)
	}
	info := activity.GetInfo(ctx)
	if info.WorkflowExecution.ID == "" {
		return nil, &activities.Error{Type: activities.ErrTypeInvalidInput,
			Message: fmt.Sprintf("%s %s: not started by a workflow; the claim owner is the workflow ID", step, key)}
	}
	c := &call{in: in, key: key, owner: info.WorkflowExecution.ID + "/" + step, step: step}
	if hb := info.HeartbeatTimeout; hb > 0 {
		c.every = max(hb/3, 100*time.Millisecond)
	}
	c.log = a.logger.With("effect_key", key.String(), "step", step, "tenant_id", in.TenantID,
		"order_id", in.OrderID, "refund_id", in.RefundID)
	return c, nil
}

// fail returns a terminal error of type typ naming c's step and key.
func (c *call) fail(typ, format string, args ...any) error {
	return &activities.Error{Type: typ, Message: strings.ReplaceAll(c.step, "_", " ") + " " + c.key.String() + ": " + fmt.Sprintf(format, args...)}
}

// doOpts renews the claim's lease and records a Temporal heartbeat three
// times per heartbeat timeout.
func (c *call) doOpts() *effects.DoOpts {
	return &effects.DoOpts{Heartbeat: recordHeartbeat, ExtendEvery: c.every}
}

// recordHeartbeat records a Temporal heartbeat; effects.Do and the Sender
// call it after every lease renewal.
func recordHeartbeat(ctx context.Context) { activity.RecordHeartbeat(ctx) }

// entry returns the refund's ledger row, or an InvalidState error when it
// was not reserved.
func (a *Activities) entry(ctx context.Context, c *call) (*Entry, error) {
	e, err := a.ledger.Get(ctx, c.in.TenantID, c.in.OrderID, c.in.RefundID)
	if errors.Is(err, ErrNotFound) {
		return nil, c.fail(activities.ErrTypeInvalidState, "refund %s is not in the ledger; Reserve must run first", c.in.RefundID)
	}
	return e, err
}

// fingerprint hashes a step's deterministic inputs for effects.ClaimParams.
func fingerprint(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return "sha256:" + hex.EncodeToString(h[:16])
}
