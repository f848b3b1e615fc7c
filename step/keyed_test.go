package step_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/step"
)

// ticket is a second pipeline's input: "<tenant>:ticket:<id>:<step>".
type ticket struct{ Tenant, ID string }

func (in ticket) Validate() error {
	if in.ID == "" {
		return errors.New("ticket has no ID")
	}
	return nil
}

func (in ticket) EffectKey(step string) (effects.Key, error) {
	return effects.NewKey(in.Tenant, "ticket", in.ID, step)
}

func (in ticket) LogAttrs() []any { return []any{"tenant_id", in.Tenant, "ticket_id", in.ID} }

var declClose = step.Keyed[ticket, string]{Declaration: step.Declaration{Name: "CloseTicket",
	Class: effects.ClassAbsoluteWrite, Step: "close"}}

func TestKeyedRefusesARunnerWithoutDBOrEffectsAndAnEffectWithoutDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	done := false
	_, err := declClose.Run(ctx, step.Runner{}, ticket{"acme", "t1"}, step.Effect[ticket, string]{
		Do: func(context.Context, *step.Call[ticket]) (string, error) { done = true; return "closed", nil }})
	require.ErrorContains(t, err, "activity CloseTicket has no DB or Effects to claim with")
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.True(t, app.NonRetryable())
	require.False(t, done)

	_, err = declClose.Run(ctx, step.Runner{}, ticket{"acme", "t1"}, step.Effect[ticket, string]{})
	require.ErrorContains(t, err, "activity CloseTicket declares no effect")
}

func TestKeyedBindsAFunctionOfItsInput(t *testing.T) {
	t.Parallel()
	def := declClose.Bind(func(context.Context, ticket) (string, error) { return "", nil })
	require.Equal(t, "CloseTicket", def.Name)
	require.NoError(t, def.Validate())
}

func TestFingerprintHashesTheParts(t *testing.T) {
	t.Parallel()
	require.Equal(t, step.Fingerprint("1250", "eur"), step.Fingerprint("1250", "eur"))
	require.NotEqual(t, step.Fingerprint("1250", "eur"), step.Fingerprint("125", "0eur"))
	require.Regexp(t, `^sha256:[0-9a-f]{32}$`, step.Fingerprint("x"))
}

// A unique violation that reaches a step's boundary is told apart, through
// any wrapping, from every other error.
func TestUniqueViolation(t *testing.T) {
	t.Parallel()
	require.True(t, step.UniqueViolation(fmt.Errorf("insert: %w", &pgconn.PgError{Code: "23505"})))
	require.False(t, step.UniqueViolation(&pgconn.PgError{Code: "40001"}))
	require.False(t, step.UniqueViolation(errors.New("23505")))
	require.False(t, step.UniqueViolation(nil))
}
