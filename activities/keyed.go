package activities

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"go.temporal.io/sdk/activity"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/tracing"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
)

// Keyed is the declaration of a keyed order activity whose stored outcome
// is T, and the helper that runs it: Run does what every keyed activity
// repeats, so that the activity's body is only its effect.
type Keyed[T any] struct{ Declaration }

// Bind returns k bound to fn, the activity's function, for Register.
func (k Keyed[T]) Bind(fn func(context.Context, orders.CheckoutInput) (T, error)) Definition {
	return k.Declaration.Bind(fn)
}

// Step is one run of a keyed activity, as Keyed.Run hands it to the effect.
type Step struct {
	In orders.CheckoutInput
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

	step  string
	every time.Duration // how often to renew the lease and heartbeat
}

// Message returns a notify.Message for an irreversible send of this step:
// template, recipient, subject and text as given, the effect key, the
// order as entity, the claim owner, and the heartbeat. Pass it to
// notify.Sender.Send, which claims the key.
func (s *Step) Message(template, to, subject, text string) notify.Message {
	return notify.Message{Template: template, To: to, Subject: subject, Text: text, Key: s.Key, Entity: s.In.OrderID,
		Owner: s.Owner, Heartbeat: heartbeat, HeartbeatEvery: s.every}
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

// Run runs e as a keyed activity of in. It validates in, derives the effect
// key from the declared step (so the key claimed always matches the
// declaration) and the owner from the workflow ID, names the key on the
// activity's trace span, loads the order (unless e.Lazy), runs e.Check,
// then claims the key and runs e.Do according to the declared class:
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
func (k Keyed[T]) Run(ctx context.Context, a *Activities, in orders.CheckoutInput, e Effect[T]) (T, error) {
	res, err := k.run(ctx, a, in, e)
	return res, ToTemporal(err)
}

func (k Keyed[T]) run(ctx context.Context, a *Activities, in orders.CheckoutInput, e Effect[T]) (T, error) {
	var zero T
	if e.Do == nil {
		return zero, fmt.Errorf("%s: activity %s declares no effect (Effect.Do is nil)", k.Step, k.Name)
	}
	s, err := a.prepare(ctx, in, k.Step)
	if err != nil {
		return zero, err
	}
	if !e.Lazy {
		if s.Order, err = a.orders.Get(ctx, in.TenantID, in.OrderID); err != nil {
			return zero, loadOrderError(s, err)
		}
	}
	if e.Check != nil {
		if err := e.Check(s); err != nil {
			return zero, err
		}
	}
	p := effects.ClaimParams{Key: s.Key, Kind: k.Step, Owner: s.Owner}
	if e.Fingerprint != nil {
		p.Fingerprint = fingerprint(e.Fingerprint(s)...)
	}
	res, err := k.claim(ctx, a, s, p, e.Do)
	if err != nil {
		s.Log.WarnContext(ctx, "step failed", "error", err)
		return zero, err
	}
	s.Log.InfoContext(ctx, "step done", "outcome", res)
	return res, nil
}

// claim runs do under the claim p as the declared class requires.
func (k Keyed[T]) claim(ctx context.Context, a *Activities, s *Step, p effects.ClaimParams,
	do func(context.Context, *Step) (T, error)) (T, error) {
	switch k.Class {
	case effects.ClassAbsoluteWrite, effects.ClassRelativeWrite:
		var out T
		err := pgx.BeginFunc(ctx, a.db, func(tx pgx.Tx) error {
			res, err := effects.DoTx(ctx, a.claims, tx, p, func(ctx context.Context, tx pgx.Tx, c *effects.Claim) (T, error) {
				s.Tx, s.Claim = tx, c
				return do(ctx, s)
			})
			out = res
			return err
		})
		return out, err
	case effects.ClassIrreversibleSend:
		return do(ctx, s)
	default:
		return effects.Do(ctx, a.claims, p, func(ctx context.Context, c *effects.Claim) (T, error) {
			s.Claim = c
			return do(ctx, s)
		}, &effects.DoOpts{Heartbeat: heartbeat, ExtendEvery: s.every})
	}
}

// prepare validates in and derives step's effect key and owner, without
// touching the database. Errors: invalid input, or no workflow in the
// activity info.
func (a *Activities) prepare(ctx context.Context, in orders.CheckoutInput, step string) (*Step, error) {
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
	s := &Step{In: in, Key: key, Owner: wfID + "/" + step, step: step, every: heartbeatEvery(ctx)}
	s.Log = a.logger.With("effect_key", key.String(), "step", step, "tenant_id", in.TenantID, "order_id", in.OrderID)
	return s, nil
}

func loadOrderError(s *Step, err error) error {
	return fmt.Errorf("%s %s: load order: %w", s.step, s.Key, err)
}
