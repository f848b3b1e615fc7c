package step

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
)

// allErrTypes lists every ErrType constant, so that a constant added without
// a row in the error table fails the tests.
var allErrTypes = []string{
	ErrTypeInvalidInput, ErrTypeNotFound, ErrTypeCardDeclined, ErrTypePaymentIncomplete, ErrTypeProviderRejected,
	ErrTypeKeyReused, ErrTypeAmbiguous, ErrTypeInvalidState, ErrTypeTerminal,
	ErrTypeTransient, ErrTypeInProgress, ErrTypeLeaseLost,
}

// TestErrorTableHasOneRowPerTypeAndCode checks that every error type has
// exactly one row, and that no code (legacy ones included) belongs to two
// rows.
func TestErrorTableHasOneRowPerTypeAndCode(t *testing.T) {
	t.Parallel()
	types := map[string]bool{}
	owner := map[string]string{}
	for _, k := range errorKinds {
		require.False(t, types[k.typ], "%s has two rows", k.typ)
		types[k.typ] = true
		require.NotEmpty(t, k.code, "%s has no code", k.typ)
		require.NotEmpty(t, k.todo, "%s tells the operator nothing", k.typ)
		for _, code := range append([]string{k.code}, k.legacy...) {
			require.NotContains(t, owner, code, "%s and %s share code %s", k.typ, owner[code], code)
			owner[code] = k.typ
		}
	}
	require.ElementsMatch(t, allErrTypes, typesOf(errorKinds))
	require.Equal(t, ErrTypeTerminal, terminalKind.typ)
}

// TestErrorCodeIsOnePerTypeEveryTime checks that each error type stores
// exactly one code, every time: the stored code never depends on map
// iteration order, as it did when two codes mapped to ProviderRejected.
func TestErrorCodeIsOnePerTypeEveryTime(t *testing.T) {
	t.Parallel()
	for _, k := range errorKinds {
		for range 1000 {
			require.Equal(t, k.code, (&Error{Type: k.typ}).Code(), k.typ)
		}
	}
	require.Equal(t, "provider_rejected", (&Error{Type: ErrTypeProviderRejected}).Code())
	require.Equal(t, "terminal", (&Error{Type: "NoSuchType"}).Code())
}

// TestErrorCodeRoundTrips checks that every row's code reads back as its
// type and retryability, and writes back as the same code, and that legacy
// codes from old records read back as their type.
func TestErrorCodeRoundTrips(t *testing.T) {
	t.Parallel()
	for _, k := range errorKinds {
		typ, retry := ErrorType(&effects.TerminalError{Code: k.code})
		require.Equal(t, k.typ, typ, "code %s reads back as its type", k.code)
		require.Equal(t, k.retryable, retry, k.code)
		require.Equal(t, k.code, (&Error{Type: typ}).Code(), "type %s writes back as code %s", typ, k.code)
	}
	legacy := map[string]string{
		notify.CodeRejected:  ErrTypeProviderRejected,
		notify.CodeAmbiguous: ErrTypeAmbiguous, // Also effects.Do's code for an abandoned at-most-once claim.
		"unclassified":       ErrTypeTerminal,  // effects' code for an error without one.
		"no_such_code":       ErrTypeTerminal,
	}
	for code, want := range legacy {
		typ, retry := ErrorType(&effects.TerminalError{Code: code})
		require.Equal(t, want, typ, code)
		require.False(t, retry, code)
	}
	require.Equal(t, "provider_rejected", (&Error{Type: ErrTypeProviderRejected}).Code(), "a legacy code is never written")
}

// TestErrorNonRetryableTypesAreTheTerminalRows checks that every terminal
// type is in NonRetryableErrorTypes and no retryable one is.
func TestErrorNonRetryableTypesAreTheTerminalRows(t *testing.T) {
	t.Parallel()
	nonRetryable := NonRetryableErrorTypes()
	for _, k := range errorKinds {
		if k.retryable {
			require.NotContains(t, nonRetryable, k.typ)
		} else {
			require.Contains(t, nonRetryable, k.typ)
		}
	}
	require.Len(t, nonRetryable, len(errorKinds)-len(retryableKinds()))
	require.ElementsMatch(t, []string{ErrTypeTransient, ErrTypeInProgress, ErrTypeLeaseLost},
		typesOf(retryableKinds()))
}

// TestErrorSentinelsClassifyAsTheirRow checks that an *Error unwraps to its
// row's sentinel, and that each sentinel of a row, wrapped, classifies as
// the row's type.
func TestErrorSentinelsClassifyAsTheirRow(t *testing.T) {
	t.Parallel()
	for _, k := range errorKinds {
		e := &Error{Type: k.typ, Message: "m"}
		require.Equal(t, k.sentinel, e.Unwrap(), k.typ)
		for _, s := range append([]error{k.sentinel}, k.also...) {
			if s == nil {
				continue
			}
			typ, retry := ErrorType(fmt.Errorf("step: %w", s))
			require.Equal(t, k.typ, typ, "%v", s)
			require.Equal(t, k.retryable, retry, "%v", s)
		}
	}
	require.ErrorIs(t, &Error{Type: ErrTypeKeyReused}, effects.ErrKeyReused)
	require.NoError(t, (&Error{Type: ErrTypeTerminal}).Unwrap())
	domain := Sentinel(ErrNotFound, "order not found")
	require.EqualError(t, domain, "order not found")
	typ, _ := ErrorType(fmt.Errorf("load: %w", domain))
	require.Equal(t, ErrTypeNotFound, typ, "a domain sentinel classifies as its kind")
}

// TestToTemporalRetriesExactlyTheRetryableRows checks that ToTemporal marks
// an *Error of each type retryable exactly when its row is, and keeps the
// type and the error reachable.
func TestToTemporalRetriesExactlyTheRetryableRows(t *testing.T) {
	t.Parallel()
	for _, k := range errorKinds {
		e := &Error{Type: k.typ, Message: "step failed"}
		got := ToTemporal(e)
		var app *temporal.ApplicationError
		require.ErrorAs(t, got, &app)
		require.Equal(t, k.typ, app.Type())
		require.Equal(t, !k.retryable, app.NonRetryable(), k.typ)
		require.Contains(t, app.Message(), k.todo)
		var own *Error
		require.ErrorAs(t, got, &own)
		require.Same(t, e, own)
	}
	require.NoError(t, ToTemporal(nil))
	unknown := ToTemporal(errors.New("boom"))
	var app *temporal.ApplicationError
	require.ErrorAs(t, unknown, &app)
	require.Equal(t, ErrTypeTerminal, app.Type())
	require.True(t, app.NonRetryable())
}

// TestAttentionReasonsAreTheUnknownOutcomes checks the attention column:
// every retryable type and the two terminal types whose outcome is unknown
// make a run wait, and a refusal never does.
func TestAttentionReasonsAreTheUnknownOutcomes(t *testing.T) {
	t.Parallel()
	for _, k := range errorKinds {
		reason, waits := AttentionReason(k.typ)
		require.Equal(t, k.attention, reason)
		require.Equal(t, k.retryable || k.typ == ErrTypeAmbiguous || k.typ == ErrTypeKeyReused, waits, k.typ)
		require.False(t, waits && k.refusal, "%s: a refusal is a known outcome", k.typ)
	}
	_, waits := AttentionReason("NoSuchType")
	require.False(t, waits)
}

func typesOf(kinds []errorKind) []string {
	types := make([]string, 0, len(kinds))
	for _, k := range kinds {
		types = append(types, k.typ)
	}
	return types
}

func retryableKinds() []errorKind {
	var kinds []errorKind
	for _, k := range errorKinds {
		if k.retryable {
			kinds = append(kinds, k)
		}
	}
	return kinds
}

// RetryDelay is the policy's backoff for the attempt, spread over its upper
// half: 1 s doubling to 30 s under the steps' policy.
func TestRetryDelayIsTheBackoffSpreadOverItsUpperHalf(t *testing.T) {
	t.Parallel()
	p := retryPolicy()
	backoff := p.InitialInterval
	for attempt := int32(1); attempt <= 10; attempt++ {
		require.Equal(t, backoff/2, RetryDelay(p, attempt, 0), "attempt %d", attempt)
		require.Equal(t, backoff, RetryDelay(p, attempt, 1), "attempt %d", attempt)
		backoff = min(time.Duration(float64(backoff)*p.BackoffCoefficient), p.MaximumInterval)
	}
	require.Equal(t, 100*time.Second, RetryDelay(&temporal.RetryPolicy{}, 200, 1), "Temporal's defaults: 1 s, doubling, up to 100 s")
}

// In an activity a retryable step error carries its own spread retry
// delay; a terminal one, and any outside an activity, carry none.
func TestSpreadGivesRetryableActivityErrorsTheirOwnDelay(t *testing.T) {
	t.Parallel()
	env := (&testsuite.WorkflowTestSuite{}).NewTestActivityEnvironment()
	fail := func(ctx context.Context, terminal bool) error {
		err := effects.Transient(errors.New("429 Too Many Requests"))
		if terminal {
			err = fmt.Errorf("charge: %w", ErrCardDeclined)
		}
		return spread(ctx, ToTemporal(err))
	}
	env.RegisterActivityWithOptions(fail, activity.RegisterOptions{Name: "fail"})
	for _, terminal := range []bool{false, true} {
		_, err := env.ExecuteActivity("fail", terminal)
		var app *temporal.ApplicationError
		require.ErrorAs(t, err, &app)
		if terminal {
			require.Zero(t, app.NextRetryDelay())
			continue
		}
		require.Equal(t, ErrTypeTransient, app.Type())
		require.False(t, app.NonRetryable())
		require.GreaterOrEqual(t, app.NextRetryDelay(), 500*time.Millisecond)
		require.LessOrEqual(t, app.NextRetryDelay(), time.Second)
	}
	var app *temporal.ApplicationError
	require.ErrorAs(t, fail(context.Background(), false), &app)
	require.Zero(t, app.NextRetryDelay(), "outside an activity")
}
