package step_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/step"
)

type registry struct {
	mu    sync.Mutex
	names []string
}

func (r *registry) RegisterActivity(any) { panic("use RegisterActivityWithOptions") }
func (r *registry) RegisterActivityWithOptions(_ any, o activity.RegisterOptions) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names = append(r.names, o.Name)
}
func (r *registry) RegisterDynamicActivity(any, activity.DynamicRegisterOptions) {
	panic("no dynamic activities")
}

func TestRegisterRefusesUndeclaredActivities(t *testing.T) {
	t.Parallel()
	fn := func(context.Context, ticket) error { return nil }
	decl := func(name string, class effects.Class, key string) step.Declaration {
		return step.Declaration{Name: name, Class: class, Step: key}
	}
	good := decl("Refund", effects.ClassExternalCreate, "refund").Bind(fn)
	send := decl("Notify", effects.ClassIrreversibleSend, "notify")

	for name, tc := range map[string]struct {
		def  step.Definition
		want string
	}{
		"no class":          {decl("Refund2", "", "refund2").Bind(fn), "effect class"},
		"unknown class":     {decl("Refund2", "maybe", "refund2").Bind(fn), "effect class"},
		"no step":           {decl("Refund2", effects.ClassExternalCreate, "").Bind(fn), "Step"},
		"step not a key":    {decl("Refund2", effects.ClassExternalCreate, "re:fund").Bind(fn), "cannot end an effect key"},
		"no name":           {decl("", effects.ClassExternalCreate, "refund2").Bind(fn), "Name"},
		"no fn":             {decl("Refund2", effects.ClassExternalCreate, "refund2").Bind(nil), "function"},
		"not a fn":          {decl("Refund2", effects.ClassExternalCreate, "refund2").Bind(42), "function"},
		"step claimed":      {decl("Refund2", effects.ClassExternalCreate, "refund").Bind(fn), `claims step "refund", as "Refund" does`},
		"send no policy":    {send.Bind(fn), "delivery Policy"},
		"policy on a write": {step.Declaration{Name: "W", Class: effects.ClassAbsoluteWrite, Step: "w", Policy: notify.AtMostOnce}.Bind(fn), "not an irreversible send"},
		"local provider call": {step.Declaration{Name: "W", Class: effects.ClassExternalCreate, Step: "w", Local: true}.Bind(fn),
			"only writes run as local activities"},
		"queued local write": {step.Declaration{Name: "W", Class: effects.ClassAbsoluteWrite, Step: "w", Local: true, Queued: true}.Bind(fn),
			"both Queued and Local"},
		"self-guarded relative write": {step.Declaration{Name: "W", Class: effects.ClassRelativeWrite, Step: "w", SelfGuarded: true}.Bind(fn),
			"only an absolute write can be its own guard"},
		"negative timeout": {step.Declaration{Name: "W", Class: effects.ClassAbsoluteWrite, Step: "w",
			Options: step.Options{StartToClose: -time.Second}}.Bind(fn), "negative"},
	} {
		r := &registry{}
		err := step.Register(r, good, tc.def)
		require.ErrorContains(t, err, tc.want, name)
		require.Empty(t, r.names, "%s: nothing registered when one definition is bad", name)
	}

	r := &registry{}
	require.ErrorContains(t, step.Register(r, good, good), "twice")
	send.Policy = notify.AtLeastOnce
	require.NoError(t, step.Register(r, good, send.Bind(fn)))
	require.Equal(t, []string{"Refund", "Notify"}, r.names)
}

// TestActivityOptionsFollowTheClass checks each class's default options and
// that a declaration's Options override them.
func TestActivityOptionsFollowTheClass(t *testing.T) {
	t.Parallel()
	for _, class := range []effects.Class{effects.ClassAbsoluteWrite, effects.ClassRelativeWrite, effects.ClassExternalCreate, effects.ClassIrreversibleSend} {
		d := step.Declaration{Name: "X", Class: class, Step: "x"}
		o := d.ActivityOptions("acme:t:1:x")
		require.Equal(t, "x · effect acme:t:1:x", o.Summary)
		require.Equal(t, 30*time.Minute, o.ScheduleToCloseTimeout, "a step retries for up to 30 minutes")
		require.Equal(t, time.Second, o.RetryPolicy.InitialInterval)
		require.InDelta(t, 2.0, o.RetryPolicy.BackoffCoefficient, 0)
		require.Equal(t, 30*time.Second, o.RetryPolicy.MaximumInterval)
		require.Zero(t, o.RetryPolicy.MaximumAttempts, "attempts are bounded by time, not by a count")
		require.ElementsMatch(t, step.NonRetryableErrorTypes(), o.RetryPolicy.NonRetryableErrorTypes)
		switch class {
		case effects.ClassAbsoluteWrite, effects.ClassRelativeWrite:
			require.Equal(t, 30*time.Second, o.StartToCloseTimeout, class)
			require.Zero(t, o.HeartbeatTimeout, class)
		default:
			require.Equal(t, time.Minute, o.StartToCloseTimeout, class)
			require.Equal(t, step.HeartbeatTimeout, o.HeartbeatTimeout, class)
			require.Less(t, o.HeartbeatTimeout, o.StartToCloseTimeout)
		}
	}
	d := step.Declaration{Name: "X", Class: effects.ClassExternalCreate, Step: "x",
		Options: step.Options{StartToClose: 2 * time.Minute, Heartbeat: -1, ScheduleToClose: time.Hour}}
	o := d.ActivityOptions("k")
	require.Equal(t, 2*time.Minute, o.StartToCloseTimeout)
	require.Zero(t, o.HeartbeatTimeout)
	require.Equal(t, time.Hour, o.ScheduleToCloseTimeout)

	// A Local write keeps its activity options but the heartbeat.
	w := step.Declaration{Name: "W", Class: effects.ClassAbsoluteWrite, Step: "w", Local: true}
	a, l := w.ActivityOptions("k"), w.LocalActivityOptions("k")
	require.Equal(t, a.StartToCloseTimeout, l.StartToCloseTimeout)
	require.Equal(t, a.ScheduleToCloseTimeout, l.ScheduleToCloseTimeout)
	require.Equal(t, a.RetryPolicy, l.RetryPolicy)
	require.Equal(t, a.Summary, l.Summary)
	require.NoError(t, w.Validate())
}

func TestRetryWindow(t *testing.T) {
	t.Parallel()
	o := step.Declaration{Name: "X", Class: effects.ClassExternalCreate, Step: "x"}.ActivityOptions("")
	require.Equal(t, 30*time.Minute, step.RetryWindow(o), "unbounded attempts: the schedule-to-close")
	capped := workflow.ActivityOptions{StartToCloseTimeout: time.Minute, RetryPolicy: &temporal.RetryPolicy{
		MaximumAttempts: 3, InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: time.Minute}}
	require.Equal(t, 3*time.Minute+3*time.Second, step.RetryWindow(capped), "three attempts and two backoffs")
	capped.ScheduleToCloseTimeout = 2 * time.Minute
	require.Equal(t, 2*time.Minute, step.RetryWindow(capped))
}

func TestErrorType(t *testing.T) {
	t.Parallel()
	notFound := step.Sentinel(step.ErrNotFound, "order not found")
	badTransition := step.Sentinel(step.ErrInvalidState, "order is not in the required state")
	for _, tc := range []struct {
		err   error
		typ   string
		retry bool
	}{
		{errors.New("boom"), step.ErrTypeTerminal, false},
		{effects.Transient(errors.New("reset")), step.ErrTypeTransient, true},
		{&effects.InProgressError{Key: "k"}, step.ErrTypeInProgress, true},
		{effects.ErrLeaseLost, step.ErrTypeLeaseLost, true},
		{&effects.KeyReusedError{Key: "k"}, step.ErrTypeKeyReused, false},
		{&effects.TerminalError{Code: step.CodeCardDeclined}, step.ErrTypeCardDeclined, false},
		{&effects.TerminalError{Code: effects.CodeAmbiguous}, step.ErrTypeAmbiguous, false},
		{&effects.TerminalError{Code: notify.CodeRejected}, step.ErrTypeProviderRejected, false},
		{&effects.TerminalError{Code: "unclassified"}, step.ErrTypeTerminal, false},
		{effects.ErrAmbiguous, step.ErrTypeAmbiguous, false},
		{notFound, step.ErrTypeNotFound, false},
		{step.ErrUnsupportedVersion, step.ErrTypeInvalidInput, false},
		{badTransition, step.ErrTypeInvalidState, false},
		{notify.ErrInvalidMessage, step.ErrTypeInvalidInput, false},
		{&pgconn.PgError{Code: "40001"}, step.ErrTypeTransient, true},
		{&pgconn.PgError{Code: "23505"}, step.ErrTypeTerminal, false},
		{context.DeadlineExceeded, step.ErrTypeTransient, true},
		{fmt.Errorf("mark paid: %w", io.ErrUnexpectedEOF), step.ErrTypeTransient, true},
		{&pgconn.PgError{Code: "57P01"}, step.ErrTypeTransient, true},
		{errors.Join(&step.Error{Type: step.ErrTypeCardDeclined}, fmt.Errorf("fail: %w", pgconn.ErrConnClosed)),
			step.ErrTypeTransient, true},
		{temporal.NewNonRetryableApplicationError("x", "Custom", nil), "Custom", false},
	} {
		typ, retry := step.ErrorType(tc.err)
		require.Equal(t, tc.typ, typ, "%v", tc.err)
		require.Equal(t, tc.retry, retry, "%v", tc.err)
		if tc.typ != "Custom" {
			var app *temporal.ApplicationError
			require.ErrorAs(t, step.ToTemporal(tc.err), &app)
			require.Equal(t, tc.typ, app.Type())
			require.Equal(t, !tc.retry, app.NonRetryable())
			require.ErrorIs(t, app, tc.err, "the cause is kept")
		}
	}
}
