package activities

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
)

// Keyed is the declaration of a keyed order activity whose stored outcome
// is T, and the helper that runs it: Run does what every keyed activity
// repeats, so that the activity's body is only its effect. It is
// KeyedOf for orders.OrderInput, plus loading the order.
type Keyed[T any] struct{ Declaration }

// Bind returns k bound to fn, the activity's function, for Register.
func (k Keyed[T]) Bind(fn func(context.Context, orders.OrderInput) (T, error)) Definition {
	return k.Declaration.Bind(fn)
}

// Step is one run of a keyed activity, as Keyed.Run hands it to the effect.
type Step struct {
	In orders.OrderInput
	// Order is the order's current row, loaded before the claim; nil when
	// the Effect is Lazy.
	Order *orders.Order
	// Key is the effect key, in.EffectKey(declared step): send it to the
	// provider as its idempotency key.
	Key effects.Key
	// Owner is the claim owner, "<workflow ID>/<step>".
	Owner string
	// Claim is the claim the effect runs under; nil for an irreversible
	// send, which claims through notify.Sender.
	Claim *effects.Claim
	// Tx is the transaction of an absolute or relative write's claim: the
	// effect's writes go in it, so they commit with the record or not at
	// all. Nil for the other classes.
	Tx pgx.Tx
	// Log names the effect key, step, tenant and order.
	Log *slog.Logger

	step string
	call *Call[orderInput]
}

// orderInput is an orders.OrderInput as an Input.
type orderInput struct{ orders.OrderInput }

// LogAttrs names the tenant and the order.
func (in orderInput) LogAttrs() []any {
	return []any{"tenant_id", in.TenantID, "order_id", in.OrderID}
}

// newStep returns the Step of the call c.
func newStep(c *Call[orderInput]) *Step {
	return &Step{In: c.In.OrderInput, Key: c.Key, Owner: c.Owner, Log: c.Log, step: c.step, call: c}
}

// Message returns a notify.Message for an irreversible send of this step:
// template, recipient, subject and text as given, the effect key, the
// order as entity, the claim owner, and the heartbeat. Pass it to
// notify.Sender.Send, which claims the key.
func (s *Step) Message(template, to, subject, text string) notify.Message {
	return s.call.Message(template, to, subject, text, s.In.OrderID)
}

// Effect is what differs between keyed activities.
type Effect[T any] struct {
	// Lazy skips loading the order before the claim (Step.Order is nil):
	// the effect reads it itself, in Step.Tx, saving a round trip.
	Lazy bool
	// Check, if set, runs before the claim and refuses the run with its
	// error (such as an InvalidState *Error), so that a stored outcome is
	// never overwritten.
	Check func(s *Step) error
	// Fingerprint, if set, returns the step's deterministic inputs: the
	// same key with other inputs fails with KeyReused.
	Fingerprint func(s *Step) []string
	// Do makes the effect once and returns its outcome. Mark failures
	// worth retrying with effects.Transient; everything else is terminal.
	Do func(ctx context.Context, s *Step) (T, error)
}

// Run runs e as a keyed activity of in, as KeyedOf.Run does, loading the
// order (unless e.Lazy) before e.Check: it validates in, derives the effect
// key from the declared step and the owner from the workflow ID, names the
// key on the activity's trace span, loads the order, runs e.Check, then
// claims the key and runs e.Do according to the declared class:
//
//   - external create: through effects.Do, renewing the lease and
//     recording a Temporal heartbeat three times per heartbeat timeout;
//   - absolute or relative write: through effects.DoTx in one transaction
//     (Step.Tx) that commits the effect and its record together;
//   - irreversible send: e.Do claims through notify.Sender (send
//     Step.Message), so Run claims nothing itself.
//
// A second run returns the stored outcome without calling e.Do. The
// outcome is logged at info level ("step done"), a failure at warn level
// ("step failed"). Errors come back through ToTemporal:
// InvalidInput (a bad input, or no workflow in the activity info) and
// OrderNotFound before the claim, then the claim's errors (InProgress,
// LeaseLost, KeyReused) and e's.
func (k Keyed[T]) Run(ctx context.Context, a *Activities, in orders.OrderInput, e Effect[T]) (T, error) {
	var s *Step
	ge := EffectOf[orderInput, T]{Check: func(ctx context.Context, c *Call[orderInput]) error {
		s = newStep(c)
		if !e.Lazy {
			var err error
			if s.Order, err = a.orders.Get(ctx, in.TenantID, in.OrderID); err != nil {
				return loadOrderError(s, err)
			}
		}
		if e.Check != nil {
			return e.Check(s)
		}
		return nil
	}}
	if e.Fingerprint != nil {
		ge.Fingerprint = func(*Call[orderInput]) []string { return e.Fingerprint(s) }
	}
	if e.Do != nil {
		ge.Do = func(ctx context.Context, c *Call[orderInput]) (T, error) {
			s.Claim, s.Tx = c.Claim, c.Tx
			return e.Do(ctx, s)
		}
	}
	return KeyedOf[orderInput, T](k).Run(ctx, a.runner(), orderInput{in}, ge)
}

// runner returns what KeyedOf.Run claims with.
func (a *Activities) runner() Runner {
	return Runner{DB: a.db, Effects: a.claims, Logger: a.logger}
}

// prepare validates in and derives step's effect key and owner, without
// touching the database. Errors: invalid input, or no workflow in the
// activity info.
func (a *Activities) prepare(ctx context.Context, in orders.OrderInput, step string) (*Step, error) {
	c, err := newCall(ctx, a.logger, orderInput{in}, step)
	if err != nil {
		return nil, err
	}
	return newStep(c), nil
}

func loadOrderError(s *Step, err error) error {
	return fmt.Errorf("%s %s: load order: %w", s.step, s.Key, err)
}
