package activities

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/activity"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/tracing"
	"github.com/keyedhq/keyed/notify"
)

// Input is the input of a keyed activity of any pipeline: a versioned
// business event that names the effect key of each of its steps.
// orders.OrderInput (through Keyed) and refunds.RefundInput are inputs.
type Input interface {
	// Validate returns an error saying what is wrong with the input; an
	// error wrapping ErrInvalidInput, effects.ErrInvalidKey or
	// orders.ErrUnsupportedVersion is classified InvalidInput.
	Validate() error
	// EffectKey returns the effect key of the given step of the event,
	// such as "acme:order:9f3a:charge", or an error wrapping
	// effects.ErrInvalidKey.
	EffectKey(step string) (effects.Key, error)
	// LogAttrs returns the key-value pairs that name the event in the
	// step's log records, such as "tenant_id", "acme", "order_id", "9f3a".
	LogAttrs() []any
}

// Runner is what KeyedOf.Run claims with: the pool whose transaction an
// absolute or relative write runs in, the effects client, and the logger of
// step outcomes. A nil Logger means slog.Default().
type Runner struct {
	DB      *pgxpool.Pool
	Effects *effects.Client
	Logger  *slog.Logger
}

// KeyedOf is the declaration of a keyed activity whose input is In and
// whose stored outcome is T, and the helper that runs it: Run does what
// every keyed activity repeats, so that the activity's body is only its
// effect. Keyed is the order pipeline's variant, which also loads the order.
type KeyedOf[In Input, T any] struct{ Declaration }

// Bind returns k bound to fn, the activity's function, for Register.
func (k KeyedOf[In, T]) Bind(fn func(context.Context, In) (T, error)) Definition {
	return k.Declaration.Bind(fn)
}

// Call is one run of a keyed activity of input In, as KeyedOf.Run hands it
// to the effect.
type Call[In Input] struct {
	In In
	// Key is the effect key, In.EffectKey(declared step): send it to the
	// provider as its idempotency key.
	Key effects.Key
	// Owner is the claim owner, "<workflow ID>/<step>".
	Owner string
	// Claim is the claim the effect runs under; nil before the claim and
	// for an irreversible send, which claims through notify.Sender.
	Claim *effects.Claim
	// Tx is the transaction of an absolute or relative write's claim: the
	// effect's writes go in it, so they commit with the record or not at
	// all. Nil for the other classes.
	Tx pgx.Tx
	// Log names the effect key, the step and In's LogAttrs.
	Log *slog.Logger

	step  string
	every time.Duration // how often to renew the lease and heartbeat
}

// String names the run in error messages: the step, with spaces for
// underscores, and the effect key, such as "refund stripe
// acme:order:9f3a:refund:r1:refund_stripe".
func (c *Call[In]) String() string {
	return strings.ReplaceAll(c.step, "_", " ") + " " + c.Key.String()
}

// Fail returns a terminal *Error of type typ (one of the ErrType constants)
// whose message is c's name followed by the formatted text.
func (c *Call[In]) Fail(typ, format string, args ...any) error {
	return &Error{Type: typ, Message: c.String() + ": " + fmt.Sprintf(format, args...)}
}

// Message returns a notify.Message for an irreversible send of this run:
// template, recipient, subject, text and entity (what notify's collapse
// window groups by, such as the order ID) as given, the effect key, the
// claim owner, and the heartbeat. Pass it to notify.Sender.Send, which
// claims the key.
func (c *Call[In]) Message(template, to, subject, text, entity string) notify.Message {
	return notify.Message{Template: template, To: to, Subject: subject, Text: text, Key: c.Key, Entity: entity,
		Owner: c.Owner, Heartbeat: heartbeat, HeartbeatEvery: c.every}
}

// EffectOf is what differs between keyed activities of input In.
type EffectOf[In Input, T any] struct {
	// Check, if set, runs before the claim: it loads what Fingerprint and
	// Do need (keep it in variables of the activity) and refuses the run
	// with its error (such as an InvalidState error from Call.Fail), so
	// that a stored outcome is never overwritten.
	Check func(ctx context.Context, c *Call[In]) error
	// Fingerprint, if set, returns the step's deterministic inputs: the
	// same key with other inputs fails with KeyReused.
	Fingerprint func(c *Call[In]) []string
	// Do makes the effect once and returns its outcome. Mark failures
	// worth retrying with effects.Transient; everything else is terminal.
	Do func(ctx context.Context, c *Call[In]) (T, error)
	// RecordRefusal, for the write classes, keeps a terminal refusal of Do
	// (an *Error, such as one from Call.Fail): the transaction rolls back
	// with everything Do wrote, and then a second one records the effect as
	// failed with the refusal's code, so that the refusal shows where the
	// effect's records are read and a repeat gets it without running Do.
	// Leave it off where a later run of the same key may rightly succeed.
	RecordRefusal bool
}

// Run runs e as a keyed activity of in, with r. It validates in, derives
// the effect key from the declared step (so the key claimed always matches
// the declaration) and the owner from the workflow ID, names the key on
// the activity's trace span, runs e.Check, then claims the key and runs
// e.Do according to the declared class:
//
//   - external create: through effects.Do, renewing the lease and
//     recording a Temporal heartbeat three times per heartbeat timeout;
//   - absolute or relative write: through effects.DoTx in one transaction
//     (Call.Tx) that commits the effect and its record together;
//   - irreversible send: e.Do claims through notify.Sender (send
//     Call.Message), so Run claims nothing itself.
//
// A second run returns the stored outcome without calling e.Do. The
// outcome is logged at info level ("step done"), a failure at warn level
// ("step failed"). Errors come back through ToTemporal: InvalidInput (a bad
// input, or no workflow in the activity info) before the claim, then
// e.Check's, the claim's (InProgress, LeaseLost, KeyReused) and e.Do's. A
// Runner without DB or Effects, or an e without Do, is a terminal error.
func (k KeyedOf[In, T]) Run(ctx context.Context, r Runner, in In, e EffectOf[In, T]) (T, error) {
	res, err := k.run(ctx, r, in, e)
	return res, ToTemporal(err)
}

func (k KeyedOf[In, T]) run(ctx context.Context, r Runner, in In, e EffectOf[In, T]) (T, error) {
	var zero T
	switch {
	case e.Do == nil:
		return zero, fmt.Errorf("%s: activity %s declares no effect (Effect.Do is nil)", k.Step, k.Name)
	case r.DB == nil || r.Effects == nil:
		return zero, fmt.Errorf("%s: activity %s has no DB or Effects to claim with (Runner)", k.Step, k.Name)
	}
	logger := r.Logger
	if logger == nil {
		logger = slog.Default()
	}
	c, err := newCall(ctx, logger, in, k.Step)
	if err != nil {
		return zero, err
	}
	if e.Check != nil {
		if err := e.Check(ctx, c); err != nil {
			return zero, err
		}
	}
	p := effects.ClaimParams{Key: c.Key, Kind: k.Step, Owner: c.Owner}
	if e.Fingerprint != nil {
		p.Fingerprint = Fingerprint(e.Fingerprint(c)...)
	}
	res, err := k.claim(ctx, r, c, p, e.Do)
	if err != nil && e.RecordRefusal {
		err = k.recordRefusal(ctx, r, p, err)
	}
	if err != nil {
		c.Log.WarnContext(ctx, "step failed", "error", err)
		return zero, err
	}
	c.Log.InfoContext(ctx, "step done", "outcome", res)
	return res, nil
}

// claim runs do under the claim p as the declared class requires.
func (k KeyedOf[In, T]) claim(ctx context.Context, r Runner, c *Call[In], p effects.ClaimParams,
	do func(context.Context, *Call[In]) (T, error)) (T, error) {
	switch k.Class {
	case effects.ClassAbsoluteWrite, effects.ClassRelativeWrite:
		var out T
		err := pgx.BeginFunc(ctx, r.DB, func(tx pgx.Tx) error {
			res, err := effects.DoTx(ctx, r.Effects, tx, p, func(ctx context.Context, tx pgx.Tx, cl *effects.Claim) (T, error) {
				c.Tx, c.Claim = tx, cl
				return do(ctx, c)
			})
			out = res
			return err
		})
		return out, err
	case effects.ClassIrreversibleSend:
		return do(ctx, c)
	default:
		return effects.Do(ctx, r.Effects, p, func(ctx context.Context, cl *effects.Claim) (T, error) {
			c.Claim = cl
			return do(ctx, c)
		}, &effects.DoOpts{Heartbeat: heartbeat, ExtendEvery: c.every})
	}
}

// recordRefusal records refusal, Do's terminal *Error from a write whose
// transaction rolled back, as the failed effect p in a transaction of its
// own, and returns refusal, joined with the error of recording it if that
// failed. Other errors, and other classes, come back as they are.
func (k KeyedOf[In, T]) recordRefusal(ctx context.Context, r Runner, p effects.ClaimParams, refusal error) error {
	var e *Error
	if !errors.As(refusal, &e) || effects.IsTransient(refusal) ||
		(k.Class != effects.ClassAbsoluteWrite && k.Class != effects.ClassRelativeWrite) {
		return refusal
	}
	err := pgx.BeginFunc(context.WithoutCancel(ctx), r.DB, func(tx pgx.Tx) error {
		cl, err := r.Effects.ClaimTx(ctx, tx, p)
		if err != nil || cl.Done {
			return err
		}
		return r.Effects.FailTx(ctx, tx, cl, refusal)
	})
	if err != nil && !errors.Is(err, effects.ErrTerminal) {
		return errors.Join(refusal, fmt.Errorf("record the refusal of %s: %w", p.Key, err))
	}
	return refusal
}

// newCall validates in and derives step's effect key and owner, without
// touching the database. Errors: invalid input, or no workflow in the
// activity info.
func newCall[In Input](ctx context.Context, logger *slog.Logger, in In, step string) (*Call[In], error) {
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
	c := &Call[In]{In: in, Key: key, Owner: wfID + "/" + step, step: step, every: heartbeatEvery(ctx)}
	c.Log = logger.With(append([]any{"effect_key", key.String(), "step", step}, in.LogAttrs()...)...)
	return c, nil
}

// Fingerprint hashes a step's deterministic inputs for
// effects.ClaimParams.Fingerprint, as EffectOf.Fingerprint's are hashed:
// "sha256:" and 32 hex digits.
func Fingerprint(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return "sha256:" + hex.EncodeToString(h[:16])
}
