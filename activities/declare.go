package activities

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

// Default activity timeouts, per effect class (see Declaration.ActivityOptions).
// A killed worker is noticed through the heartbeat timeout of the provider
// calls, so it is short; the retry then re-enters the same effect claim at
// once.
const (
	// ExternalStartToClose bounds one attempt of a provider call (external
	// create, irreversible send): a request is capped at 30s, plus the claim
	// and the record.
	ExternalStartToClose = time.Minute
	// HeartbeatTimeout is how long a provider call may go without a
	// heartbeat before Temporal retries it on another worker.
	HeartbeatTimeout = 15 * time.Second
	// DatabaseStartToClose bounds one attempt of an absolute or relative
	// write, which has no heartbeat.
	DatabaseStartToClose = 30 * time.Second
	// StepScheduleToClose is how long a step keeps retrying transient
	// failures before the run fails: long enough to ride out a Postgres
	// restart, a provider outage of several minutes, and SendGrid's
	// indexing lag while a receipt's fate is looked up (notify's
	// DefaultLookupLag plus DefaultLookupGiveUp, 15 minutes).
	StepScheduleToClose = 30 * time.Minute
)

// RetryPolicy returns the retry policy of every step: exponential backoff
// from 1s doubling up to 30s, attempts bounded by the schedule-to-close
// timeout rather than by a count, and no retry for the terminal error types
// (NonRetryableErrorTypes).
func RetryPolicy() *temporal.RetryPolicy {
	return &temporal.RetryPolicy{
		InitialInterval:        time.Second,
		BackoffCoefficient:     2,
		MaximumInterval:        30 * time.Second,
		NonRetryableErrorTypes: NonRetryableErrorTypes(),
	}
}

// Options overrides the activity options an effect class gives a
// declaration. A zero field keeps the class default.
type Options struct {
	// StartToClose bounds one attempt.
	StartToClose time.Duration
	// Heartbeat is the heartbeat timeout; a negative value means none.
	Heartbeat time.Duration
	// ScheduleToClose bounds all attempts of the step together.
	ScheduleToClose time.Duration
}

// Declaration declares a keyed activity. It is the single source of the
// activity's registered name, its effect class, the step its effect keys
// end with (an order's "<tenant>:order:<order>:<step>", a refund's
// "<tenant>:order:<order>:refund:<refund_id>:<step>": the input's
// EffectKey decides the rest), its delivery policy when it is an
// irreversible send, and its Temporal activity options (defaulted per
// class, see ActivityOptions). Register, the workflow, LongestRun, the
// status query and `starter doctor` all read it.
type Declaration struct {
	Name  string
	Class effects.Class
	Step  string
	// Policy is the delivery policy an irreversible send is written for:
	// what it does when SendGrid cannot say whether an earlier attempt went
	// out. Register requires one on a send and refuses one on any other
	// class; `starter doctor` shows it. The notify.Sender applies the policy
	// configured for the message's template (RECEIPT_POLICY for the
	// receipt), at most once by default.
	Policy notify.Policy
	// Options overrides the class's default activity options.
	Options Options
	// Outcome checks the outcome an operator gives the step with a "done"
	// decision, before the decision enters the run's history (the decide
	// update's validator) and again before it is applied. Declare and
	// DeclareOf set it from the step's outcome type; nil means "done" needs
	// a result, which nothing checks.
	Outcome Outcome `json:"-"`
}

// ActivityOptions returns the Temporal activity options of d for a run
// whose effect key is key. Every class retries with RetryPolicy for up to
// StepScheduleToClose. External creates and irreversible sends get
// ExternalStartToClose and a HeartbeatTimeout (Keyed.Run renews the claim
// and heartbeats three times per timeout); absolute and relative writes,
// one database transaction, get DatabaseStartToClose and no heartbeat.
// Fields set in d.Options override these. The Summary, shown in the Web UI
// and the CLI, names the step and the effect key.
func (d Declaration) ActivityOptions(key string) workflow.ActivityOptions {
	o := workflow.ActivityOptions{
		ScheduleToCloseTimeout: StepScheduleToClose,
		StartToCloseTimeout:    ExternalStartToClose,
		HeartbeatTimeout:       HeartbeatTimeout,
		RetryPolicy:            RetryPolicy(),
		Summary:                d.Step + " · effect " + key,
	}
	if d.Class == effects.ClassAbsoluteWrite || d.Class == effects.ClassRelativeWrite {
		o.StartToCloseTimeout, o.HeartbeatTimeout = DatabaseStartToClose, 0
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

// Validate returns an error saying what is wrong with d: no Name, an
// invalid Class, no Step or one that cannot end an effect key, a Policy on
// a class other than an irreversible send or a missing or unknown one on a
// send, or a negative timeout.
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

// Definition is a Declaration bound to the function that implements it.
// Keyed.Bind makes one with the function's type checked.
type Definition struct {
	Declaration
	Fn any
	// Verify, if set, checks an operator's "done" outcome of the step
	// against the provider's record before pipeline.Decider applies it
	// (see Verify). Keyed.Verifier and KeyedOf.Verifier make one.
	Verify Verify
}

// Bind returns d bound to fn, for Register. Prefer Keyed.Bind, which checks
// fn's type.
func (d Declaration) Bind(fn any) Definition { return Definition{Declaration: d, Fn: fn} }

// Register registers each definition with r under its Name. It checks all
// of them first and registers none if one does not Validate, has a Fn that
// is not a function, or shares its Name or its Step with another (two
// activities claiming the same effect key): an activity whose effect has
// not been classified does not run. The check covers one call: register
// every pipeline of a worker in one call (as the worker does with the order
// and refund pipelines).
func Register(r worker.ActivityRegistry, defs ...Definition) error {
	if r == nil {
		return errors.New("activities: Register: registry is nil")
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
			return fmt.Errorf("activities: Register: definition %d: %w", i, err)
		}
		names[d.Name], steps[d.Step] = true, d.Name
	}
	for _, d := range defs {
		r.RegisterActivityWithOptions(d.Fn, activity.RegisterOptions{Name: d.Name})
	}
	return nil
}
