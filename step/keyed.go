package step

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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/activity"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/tracing"
	"github.com/keyedhq/keyed/notify"
)

// Input is a keyed step's input: a versioned business event that names
// the effect key of each of its steps.
type Input interface {
	// Validate returns an error saying what is wrong; one wrapping
	// ErrInvalidInput, ErrUnsupportedVersion or effects.ErrInvalidKey is
	// classified InvalidInput.
	Validate() error
	// EffectKey returns the effect key of the event's step, such as
	// "acme:order:9f3a:charge".
	EffectKey(step string) (effects.Key, error)
	// LogAttrs returns the key-value pairs that name the event in logs.
	LogAttrs() []any
}

// Runner is what Keyed.Run claims with. A nil Logger means slog.Default();
// a nil Gate runs every first attempt in the workflow task.
type Runner struct {
	DB      *pgxpool.Pool
	Effects *effects.Client
	Logger  *slog.Logger
	Gate    *LocalGate
}

// Keyed is the declaration of a keyed step whose input is In and whose
// stored outcome is T, and the helper that runs it.
type Keyed[In Input, T any] struct{ Declaration }

// Declare returns the step declared by d, with d.Outcome set to
// OutcomeOf[T] unless d has one.
func Declare[In Input, T any](d Declaration) Keyed[In, T] {
	if d.Outcome == nil {
		d.Outcome = OutcomeOf[T]()
	}
	return Keyed[In, T]{d}
}

// Bind returns k bound to fn, the activity's function, for Register.
func (k Keyed[In, T]) Bind(fn func(context.Context, In) (T, error)) Definition {
	return k.Declaration.Bind(fn)
}

// Define returns k bound to fn, as Bind does, with verify (nil: none)
// checking an operator's "done" outcome of the step.
func (k Keyed[In, T]) Define(fn func(context.Context, In) (T, error), verify func(ctx context.Context, key effects.Key, outcome T) error) Definition {
	def := k.Bind(fn)
	if verify != nil {
		def.Verify = k.verifier(verify)
	}
	return def
}

// verifier adapts fn, which checks the step's outcome as a T, to a Verify.
func (k Keyed[In, T]) verifier(fn func(ctx context.Context, key effects.Key, outcome T) error) Verify {
	return func(ctx context.Context, key effects.Key, outcome any) error {
		v, ok := outcome.(T)
		if !ok {
			return Unverifiable("%s %s: the outcome to check is a %T, not the step's", strings.ReplaceAll(k.Step, "_", " "), key, outcome)
		}
		return fn(ctx, key, v)
	}
}

// Call is one run of a keyed step, as Keyed.Run hands it to the effect.
type Call[In Input] struct {
	In In
	// Key is In.EffectKey(declared step): send it to the provider as its
	// idempotency key.
	Key effects.Key
	// Owner is the claim owner, "<workflow ID>/<step>".
	Owner string
	// Claim is the claim the effect runs under; nil in Check, for an
	// irreversible send, which claims through notify.Sender, and for a
	// self-guarded write, which claims nothing.
	Claim *effects.Claim
	// Tx is a write's transaction: the effect's writes commit with its
	// record or not at all. Nil for the other classes and for a
	// self-guarded write, whose one statement is its own transaction.
	Tx pgx.Tx
	// Log names the effect key, the step and In's LogAttrs.
	Log *slog.Logger

	step      string
	every     time.Duration // how often to renew the lease and heartbeat
	notBefore time.Time     // Effect.NotBefore's answer, or zero
	repeat    bool          // a later attempt: the key most likely has a record
}

// String names the run in error messages: the step with spaces for
// underscores, and the effect key.
func (c *Call[In]) String() string {
	return strings.ReplaceAll(c.step, "_", " ") + " " + c.Key.String()
}

// Fail returns a terminal *Error of type typ whose message is c's name and
// the formatted text.
func (c *Call[In]) Fail(typ, format string, args ...any) error {
	return &Error{Type: typ, Message: c.String() + ": " + fmt.Sprintf(format, args...)}
}

// Message returns the notify.Message of an irreversible send of this run,
// with its effect key, claim owner and heartbeat, for notify.Sender.Send.
func (c *Call[In]) Message(template, to, subject, text, entity string) notify.Message {
	return notify.Message{Template: template, To: to, Subject: subject, Text: text, Key: c.Key, Entity: entity,
		Owner: c.Owner, Heartbeat: heartbeat, HeartbeatEvery: c.every, NotBefore: c.notBefore, Repeat: c.repeat}
}

// Effect is what differs between keyed steps of input In.
type Effect[In Input, T any] struct {
	// Check, if set, runs before the claim: it loads what Fingerprint and
	// Do need, and refuses the run with its error so that a stored outcome
	// is never overwritten.
	Check func(ctx context.Context, c *Call[In]) error
	// Fingerprint, if set, lists the step's deterministic inputs: the same
	// key with other inputs fails with KeyReused.
	Fingerprint func(c *Call[In]) []string
	// NotBefore, if set, runs after Check and returns when the business
	// record the key derives from was created, as the database stored it
	// (an order's created_at): the claim, Message's included, then looks
	// for the key in fewer leaves (effects.ClaimParams.NotBefore). Never
	// a time taken now: a key claimed before it would be claimed again.
	NotBefore func(c *Call[In]) time.Time
	// Do makes the effect once. Mark failures worth retrying with
	// effects.Transient; everything else is terminal.
	Do func(ctx context.Context, c *Call[In]) (T, error)
	// RecordRefusal, for writes, records a terminal *Error of Do as the
	// effect's failure after its transaction rolled back, so that a repeat
	// gets it without running Do.
	RecordRefusal bool
}

// Run runs e as a keyed step of in with r: it validates in, derives the
// effect key and owner, runs e.Check, claims the key as the declared class
// requires (Do for external creates, DoTx for writes, e.Do's sender for
// sends, nothing for a self-guarded write, whose Do finds its own row on a
// repeat) and logs the outcome. A second run returns the stored outcome.
// Errors come back through ToTemporal.
func (k Keyed[In, T]) Run(ctx context.Context, r Runner, in In, e Effect[In, T]) (T, error) {
	res, err := k.run(ctx, r, in, e)
	if UniqueViolation(err) && activity.IsActivity(ctx) {
		activity.GetMetricsHandler(ctx).WithTags(map[string]string{"step": k.Step}).Counter(MetricUniqueViolations).Inc(1)
	}
	return res, spread(ctx, ToTemporal(err))
}

// MetricUniqueViolations counts unique-constraint violations (23505) that
// reached a step's boundary instead of being handled as a duplicate by a
// claim or a transition: a bug in the guard. Prometheus shows
// keyed_unhandled_unique_violations_total{step}.
const MetricUniqueViolations = "keyed_unhandled_unique_violations"

// UniqueViolation reports whether err's chain holds a Postgres
// unique_violation (23505).
func UniqueViolation(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "23505"
}

func (k Keyed[In, T]) run(ctx context.Context, r Runner, in In, e Effect[In, T]) (T, error) {
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
	if activity.GetInfo(ctx).IsLocalActivity && !k.Local {
		release, err := r.Gate.admit(k.Provider, c.Key.Tenant())
		if err != nil {
			return zero, err
		}
		defer release()
	}
	if e.Check != nil {
		if err := e.Check(ctx, c); err != nil {
			return zero, err
		}
	}
	if e.NotBefore != nil {
		c.notBefore = e.NotBefore(c)
	}
	p := effects.ClaimParams{Key: c.Key, Kind: k.Step, Owner: c.Owner, NotBefore: c.notBefore, Repeat: c.repeat}
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
func (k Keyed[In, T]) claim(ctx context.Context, r Runner, c *Call[In], p effects.ClaimParams,
	do func(context.Context, *Call[In]) (T, error)) (T, error) {
	if k.SelfGuarded {
		return do(ctx, c)
	}
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
		// An external create sends its key as the provider's idempotency
		// key, so its claim need not wait for the WAL flush: one lost in
		// a crash is claimed anew, and the provider answers the repeat with
		// the first call's result (docs/design.md, "A claim that need not
		// be flushed").
		p.AsyncCommit = k.Class == effects.ClassExternalCreate
		return effects.Do(ctx, r.Effects, p, func(ctx context.Context, cl *effects.Claim) (T, error) {
			c.Claim = cl
			return do(ctx, c)
		}, &effects.DoOpts{Heartbeat: heartbeat, ExtendEvery: c.every})
	}
}

// recordRefusal records refusal, a write's terminal *Error, as the failed
// effect p in a transaction of its own; other errors come back as they are.
func (k Keyed[In, T]) recordRefusal(ctx context.Context, r Runner, p effects.ClaimParams, refusal error) error {
	var e *Error
	if !errors.As(refusal, &e) || effects.IsTransient(refusal) || k.SelfGuarded ||
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

// newCall validates in and derives step's effect key and owner.
func newCall[In Input](ctx context.Context, logger *slog.Logger, in In, step string) (*Call[In], error) {
	if err := in.Validate(); err != nil {
		return nil, fmt.Errorf("%s: check input: %w", step, err)
	}
	key, err := in.EffectKey(step)
	if err != nil {
		return nil, fmt.Errorf("%s: derive effect key: %w", step, err)
	}
	// The activity's span names the key, and so parents the provider calls.
	tracing.SetEffectKey(ctx, key.String())
	info := activity.GetInfo(ctx)
	wfID := info.WorkflowExecution.ID
	if wfID == "" {
		return nil, &Error{Type: ErrTypeInvalidInput,
			Message: fmt.Sprintf("%s %s: not started by a workflow; the claim owner is the workflow ID", step, key)}
	}
	c := &Call[In]{In: in, Key: key, Owner: wfID + "/" + step, step: step, every: heartbeatEvery(ctx), repeat: info.Attempt > 1}
	c.Log = logger.With(append([]any{"effect_key", key.String(), "step", step}, in.LogAttrs()...)...)
	return c, nil
}

// heartbeat records a Temporal heartbeat; effects.Do calls it after every
// lease renewal.
func heartbeat(ctx context.Context) { activity.RecordHeartbeat(ctx) }

// heartbeatEvery renews the lease three times per heartbeat timeout, or at
// Do's default when the activity has none.
func heartbeatEvery(ctx context.Context) time.Duration {
	hb := activity.GetInfo(ctx).HeartbeatTimeout
	if hb <= 0 {
		return 0
	}
	return max(hb/3, 100*time.Millisecond)
}

// Fingerprint hashes a step's deterministic inputs for
// effects.ClaimParams.Fingerprint: "sha256:" and 32 hex digits.
func Fingerprint(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return "sha256:" + hex.EncodeToString(h[:16])
}
