package step

import (
	"errors"
	"fmt"
	"reflect"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
)

// Default activity options of a step, per effect class (see
// Declaration.ActivityOptions).
const (
	// HeartbeatTimeout is how long a provider call may go without a
	// heartbeat before Temporal retries it on another worker.
	HeartbeatTimeout = 15 * time.Second
	// stepScheduleToClose is how long a step keeps retrying transient
	// failures: long enough to ride out a Postgres restart, a provider
	// outage of several minutes and SendGrid's indexing lag.
	stepScheduleToClose = 30 * time.Minute

	externalStartToClose = time.Minute      // a provider call: a 30s request, the claim, the record
	databaseStartToClose = 30 * time.Second // a write: one transaction, no heartbeat
)

// RecordHorizon is how long ago an entity must have changed before a step
// treats a new claim as possibly a pruned one and asks the provider first:
// Stripe's idempotency window, well below the shortest effects retention
// the worker accepts.
const RecordHorizon = 24 * time.Hour

// retryPolicy returns the retry policy of every step: backoff from 1s
// doubling up to 30s, attempts bounded by the schedule-to-close timeout, no
// retry of the terminal error types (NonRetryableErrorTypes).
func retryPolicy() *temporal.RetryPolicy {
	return &temporal.RetryPolicy{
		InitialInterval:        time.Second,
		BackoffCoefficient:     2,
		MaximumInterval:        30 * time.Second,
		NonRetryableErrorTypes: NonRetryableErrorTypes(),
	}
}

// RetryWindow returns the longest one step with options o can keep
// retrying: its schedule-to-close timeout or, when the policy caps the
// attempts and that is sooner, every attempt plus every backoff. An effect
// record must outlive it.
func RetryWindow(o workflow.ActivityOptions) time.Duration {
	p := o.RetryPolicy
	if p == nil || p.MaximumAttempts <= 0 {
		return o.ScheduleToCloseTimeout
	}
	total := time.Duration(p.MaximumAttempts) * o.StartToCloseTimeout
	interval := p.InitialInterval
	for i := int32(1); i < p.MaximumAttempts; i++ {
		total += interval
		interval = min(time.Duration(float64(interval)*p.BackoffCoefficient), p.MaximumInterval)
	}
	if o.ScheduleToCloseTimeout > 0 {
		return min(total, o.ScheduleToCloseTimeout)
	}
	return total
}

// Options overrides the activity options of a declaration's class. A zero
// field keeps the class default; a negative Heartbeat means none.
type Options struct {
	StartToClose    time.Duration
	Heartbeat       time.Duration
	ScheduleToClose time.Duration
}

// Keep names how long a step's effect records are kept: KeepDefault for
// EFFECTS_RETENTION, KeepMoney for MONEY_RETENTION (charges and refunds,
// which a dispute can question for months).
type Keep int

const (
	KeepDefault Keep = iota
	KeepMoney
)

// Declaration declares a keyed step: the single source of its activity
// name, effect class, key step (the last part of its effect key), delivery
// policy (irreversible sends only), activity options and the rule for an
// operator's "done" outcome. Register, the workflow side, doctor and the
// retention check all read it.
type Declaration struct {
	Name string
	// Class says what a repeat of the step does. An external create must
	// send its effect key to the provider as the idempotency key: a repeat
	// relies on it, and so does its claim, which commits without waiting
	// for the WAL flush.
	Class effects.Class
	Step  string
	// Policy is what an irreversible send does when the provider cannot
	// say whether an earlier attempt went out. Required on a send, refused
	// on any other class.
	Policy  notify.Policy
	Options Options
	// Keep says how long the step's effect records are kept.
	Keep Keep
	// Provider names the provider the step calls, such as "stripe"; empty
	// for none. A run schedules the step on that provider's task queue
	// when the worker gives it one (pipeline.Opts.ProviderQueues).
	Provider string
	// Local runs the step as a local activity, in the worker that runs
	// its workflow task, with no trip through the task queue: for a write,
	// whose claim and transaction make a repeat attempt (a retry, or a
	// workflow task run again after a crash) safe. Refused on the other
	// classes, which call providers and heartbeat.
	Local bool
	// Queued runs every attempt of the step as an activity through the
	// task queue. Otherwise a step that is not Local makes its first
	// attempt as a local activity in the workflow task
	// (FirstAttemptOptions) in runs started by pipeline.Start, and only a
	// failed or refused first attempt goes through the queue. Set it for a
	// step that takes longer than FirstAttemptTimeout. Changing it changes
	// the commands of runs that reach the step: do it as any workflow
	// change, behind workflow.GetVersion or with no run in flight.
	Queued bool
	// SelfGuarded declares an absolute write that is its own guard: it
	// writes a row unique under its effect key (a state transition whose
	// event ID is the key) in one statement, and a repeat finds that row.
	// Such a step claims no effect record and runs in no transaction: the
	// row is its record, and its Verify checks an operator's "done"
	// against it. Refused on the other classes.
	SelfGuarded bool
	// Outcome checks an operator's "done" outcome; Declare sets it from
	// the outcome type. Nil means any JSON result.
	Outcome Outcome `json:"-"`
}

// ActivityOptions returns the Temporal activity options of d for the effect
// key key: the retry policy below for up to 30 minutes; one minute per
// attempt and HeartbeatTimeout for external creates and sends; 30 seconds
// and no heartbeat for writes; then d.Options. The Summary names the step
// and the key.
func (d Declaration) ActivityOptions(key string) workflow.ActivityOptions {
	o := workflow.ActivityOptions{
		ScheduleToCloseTimeout: stepScheduleToClose,
		StartToCloseTimeout:    externalStartToClose,
		HeartbeatTimeout:       HeartbeatTimeout,
		RetryPolicy:            retryPolicy(),
		Summary:                d.Step + " · effect " + key,
	}
	if d.Class == effects.ClassAbsoluteWrite || d.Class == effects.ClassRelativeWrite {
		o.StartToCloseTimeout, o.HeartbeatTimeout = databaseStartToClose, 0
	}
	if v := d.Options.StartToClose; v > 0 {
		o.StartToCloseTimeout = v
	}
	if v := d.Options.Heartbeat; v != 0 {
		o.HeartbeatTimeout = max(v, 0)
	}
	if v := d.Options.ScheduleToClose; v > 0 {
		o.ScheduleToCloseTimeout = v
	}
	return o
}

// LocalActivityOptions returns the local activity options of d, a Local
// write, for the effect key key: the retry policy, timeouts and summary of
// ActivityOptions, without a heartbeat.
func (d Declaration) LocalActivityOptions(key string) workflow.LocalActivityOptions {
	o := d.ActivityOptions(key)
	return workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: o.ScheduleToCloseTimeout,
		StartToCloseTimeout:    o.StartToCloseTimeout,
		RetryPolicy:            o.RetryPolicy,
		Summary:                o.Summary,
	}
}

// Validate returns an error saying what is wrong with d: no Name, an
// invalid Class, no Step or one that cannot end an effect key, a missing,
// unknown or misplaced Policy, Local on a class other than a write, Local
// with Queued, SelfGuarded on one other than an absolute write, or a
// negative timeout.
func (d Declaration) Validate() error {
	var problem string
	switch {
	case d.Name == "":
		problem = "has no Name"
	case !d.Class.Valid():
		problem = fmt.Sprintf("has effect class %q; declare one of %s, %s, %s, %s", d.Class,
			effects.ClassAbsoluteWrite, effects.ClassRelativeWrite, effects.ClassExternalCreate, effects.ClassIrreversibleSend)
	case d.Step == "":
		problem = "has no effect key Step"
	case d.Class == effects.ClassIrreversibleSend && !d.Policy.Valid():
		problem = fmt.Sprintf("is an irreversible send with delivery Policy %q; declare %s or %s", d.Policy, notify.AtMostOnce, notify.AtLeastOnce)
	case d.Class != effects.ClassIrreversibleSend && d.Policy != "":
		problem = fmt.Sprintf("declares a delivery Policy but is a %s, not an irreversible send", d.Class)
	case d.Local && d.Class != effects.ClassAbsoluteWrite && d.Class != effects.ClassRelativeWrite:
		problem = fmt.Sprintf("is Local but a %s: only writes run as local activities", d.Class)
	case d.Queued && d.Local:
		problem = "is both Queued and Local: a Local step never goes through the task queue"
	case d.SelfGuarded && d.Class != effects.ClassAbsoluteWrite:
		problem = fmt.Sprintf("is SelfGuarded but a %s: only an absolute write can be its own guard", d.Class)
	case d.Options.StartToClose < 0 || d.Options.ScheduleToClose < 0:
		problem = "has a negative timeout"
	}
	if problem == "" {
		if _, err := effects.NewKey("tenant", d.Step); err != nil {
			problem = fmt.Sprintf("has Step %q, which cannot end an effect key: %v", d.Step, err)
		}
	}
	if problem != "" {
		return fmt.Errorf("activity %q %s", d.Name, problem)
	}
	return nil
}

// Definition is a Declaration bound to the function that implements it and
// to the check of an operator's "done" outcome against the provider.
type Definition struct {
	Declaration
	Fn any
	// Verify, if set, checks a "done" outcome before it is applied.
	Verify Verify
	// Gather, if set, asks the provider what became of the effect, so that
	// keyed settles the step's waits without a person (pipeline.Settler).
	Gather Gather
}

// Bind returns d bound to fn, for Register. Prefer Keyed.Bind, which
// checks fn's type.
func (d Declaration) Bind(fn any) Definition { return Definition{Declaration: d, Fn: fn} }

// Register registers each definition with r under its Name. It registers
// none when one does not Validate, has no function, or shares its Name or
// Step with another: register every pipeline of a worker in one call.
func Register(r worker.ActivityRegistry, defs ...Definition) error {
	if r == nil {
		return errors.New("step: Register: registry is nil")
	}
	names, steps := map[string]bool{}, map[string]string{}
	for i, d := range defs {
		err := d.Validate()
		switch {
		case err != nil:
		case d.Fn == nil || reflect.TypeOf(d.Fn).Kind() != reflect.Func:
			err = fmt.Errorf("activity %q has no function", d.Name)
		case names[d.Name]:
			err = fmt.Errorf("activity %q is declared twice", d.Name)
		case steps[d.Step] != "":
			err = fmt.Errorf("activity %q claims step %q, as %q does", d.Name, d.Step, steps[d.Step])
		}
		if err != nil {
			return fmt.Errorf("step: Register: definition %d: %w", i, err)
		}
		names[d.Name], steps[d.Step] = true, d.Name
	}
	for _, d := range defs {
		r.RegisterActivityWithOptions(d.Fn, activity.RegisterOptions{Name: d.Name})
	}
	return nil
}
