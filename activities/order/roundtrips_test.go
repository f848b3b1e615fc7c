package order_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/migrations"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// statementCounter is a pgx.QueryTracer that records every statement sent,
// BEGIN and COMMIT included: each is one round trip to Postgres.
type statementCounter struct {
	mu     sync.Mutex
	sqls   []string
	claims []any  // the NotBefore of each claim statement
	async  []bool // whether each claim statement commits without a flush
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sqls = append(c.sqls, strings.Join(strings.Fields(d.SQL), " "))
	switch {
	case strings.HasPrefix(d.SQL, "SELECT * FROM keyed_effects_claim("):
		c.claims = append(c.claims, d.Args[7])
		c.async = append(c.async, d.Args[6] == true)
	case claimFromGo(d.SQL):
		c.claims = append(c.claims, d.Args[6])
		c.async = append(c.async, strings.Contains(d.SQL, "set_config('synchronous_commit', 'off'"))
	}
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the statements recorded since the last take and forgets them.
func (c *statementCounter) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.sqls
	c.sqls = nil
	return out
}

// countedPool returns a pool on a fresh migrated schema whose statements
// counter records.
func countedPool(t *testing.T, counter *statementCounter) *pgxpool.Pool {
	t.Helper()
	_, url := effectstest.NewSchema(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = migrations.Apply(context.Background(), pool, &migrations.Opts{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	return pool
}

// TestStatementsPerStep pins the SQL statements (round trips) each step of
// an order sends to Postgres, on the first run and on a repeat that finds
// the step done. Fewer is better; a change here is a change in cost. A
// told claim that went from Go (effects migration 7; not within an hour of
// a leaf's edge) costs its repeat one more: the insert, then the claim
// function; not on a later attempt (TestALaterAttemptClaimsThroughTheFunction).
// The client's read of the leaves, once a minute, is not a step's.

func TestStatementsPerStep(t *testing.T) {
	t.Parallel()
	counter := &statementCounter{}
	b := setupWith(t, setupOpts{pool: countedPool(t, counter)})
	in := b.order(t, "rt1", "pm_card_visa")
	steps := []struct {
		name        string
		run         func() error
		first, next int
	}{
		{"charge", func() error { _, err := b.charge(t, in); return err }, 3, 2},
		{"mark_paid", func() error { _, err := b.markPaid(t, in); return err }, 1, 1},
		{"receipt", func() error { _, err := b.receipt(t, in); return err }, 4, 2},
	}
	total := 0
	for _, s := range steps {
		counter.take()
		require.NoError(t, s.run(), s.name)
		first := stepStatements(counter.take())
		require.NoError(t, s.run(), s.name+" again")
		next := stepStatements(counter.take())
		t.Logf("%s: %d statements first, %d on a repeat:\n  %s\n  repeat:\n  %s", s.name, len(first), len(next),
			strings.Join(first, "\n  "), strings.Join(next, "\n  "))
		require.Len(t, first, s.first, "%s, first run:\n%s", s.name, strings.Join(first, "\n"))
		require.Len(t, next, s.next+fromGo(first), "%s, repeat:\n%s", s.name, strings.Join(next, "\n"))
		total += len(first)
	}
	t.Logf("%d statements per order", total)
}

// stepStatements is sqls without the effects client's read of the leaves.
func stepStatements(sqls []string) []string {
	return slices.DeleteFunc(sqls, func(sql string) bool { return strings.Contains(sql, "keyed_effects_claim_leaves()") })
}

// claimFromGo reports a told claim's insert from Go.
func claimFromGo(sql string) bool {
	return strings.HasPrefix(strings.TrimSpace(sql), "INSERT INTO") && strings.Contains(sql, "keyed_effects_claim_leaf(")
}

// fromGo counts the claims in sqls that went from Go.
func fromGo(sqls []string) int {
	n := 0
	for _, sql := range sqls {
		if claimFromGo(sql) {
			n++
		}
	}
	return n
}

// TestClaimsAreToldWhenTheOrderWasCreated: the charge's and the receipt's
// claims carry the order's created_at as NotBefore, so that each looks for
// its key only in the leaves from the order's day on.
func TestClaimsAreToldWhenTheOrderWasCreated(t *testing.T) {
	t.Parallel()
	b, in, counter := countedOrder(t, "nb1")
	o, err := b.store.Get(context.Background(), in.TenantID, in.OrderID)
	require.NoError(t, err)

	counter.mu.Lock()
	defer counter.mu.Unlock()
	require.Len(t, counter.claims, 2, "the charge's and the receipt's claims")
	for _, arg := range counter.claims {
		nb, ok := arg.(pgtype.Timestamptz)
		require.True(t, ok, "NotBefore is a timestamptz: %T", arg)
		require.True(t, nb.Time.Equal(o.CreatedAt), "NotBefore %s, order created %s", nb.Time, o.CreatedAt)
	}
}

// The charge, an external create whose key Stripe takes as its
// idempotency key, claims without waiting for the WAL flush; the receipt,
// an irreversible send, waits for it (docs/design.md, "A claim that need
// not be flushed").
func TestOnlyTheChargeClaimsWithoutAFlush(t *testing.T) {
	t.Parallel()
	_, _, counter := countedOrder(t, "async1")
	counter.mu.Lock()
	defer counter.mu.Unlock()
	require.Equal(t, []bool{true, false}, counter.async, "the charge's claim, then the receipt's")
}

// countedOrder creates order id on a pool whose statements the returned
// counter records and runs its charge, MarkPaid and receipt.
func countedOrder(t *testing.T, id string) (*bundle, orders.OrderInput, *statementCounter) {
	t.Helper()
	counter := &statementCounter{}
	b := setupWith(t, setupOpts{pool: countedPool(t, counter)})
	in := b.order(t, id, "pm_card_visa")
	_, err := b.charge(t, in)
	require.NoError(t, err)
	_, err = b.markPaid(t, in)
	require.NoError(t, err)
	_, err = b.receipt(t, in)
	require.NoError(t, err)
	return b, in, counter
}

// A later attempt is a Repeat (effects.ClaimParams.Repeat): its claim goes
// straight to the claim function, which reads the record the first attempt
// left, where an insert from Go would only meet it. Each step's first
// attempt claims (from Go, or through the function within an hour of a
// leaf's edge) and meets its provider's 500; Temporal's retry claims
// through the function alone and acts once.
func TestALaterAttemptClaimsThroughTheFunction(t *testing.T) {
	t.Parallel()
	for _, name := range []string{ordersteps.NameCharge, ordersteps.NameSendReceipt} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			counter := &statementCounter{}
			b := setupWith(t, setupOpts{pool: countedPool(t, counter)})
			in := b.order(t, "rt_retry", "pm_card_visa")
			if name == ordersteps.NameCharge {
				b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultServerError})
			} else {
				_, err := b.charge(t, in)
				require.NoError(t, err)
				_, err = b.markPaid(t, in)
				require.NoError(t, err)
				b.sendgrid.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultServerError})
			}
			counter.take()
			runRetried(t, b, name, in)
			require.Equal(t, 1, b.stripe.Charges())
			if name == ordersteps.NameSendReceipt {
				require.Len(t, b.sendgrid.Messages(), 1)
			}

			// The claims in the order sent: the first attempt's, from Go
			// (through the function too within an hour of a leaf's edge,
			// which leaves are cut at), then the retry's, through the
			// function alone.
			var claims []string
			for _, sql := range stepStatements(counter.take()) {
				switch {
				case claimFromGo(sql):
					claims = append(claims, "from Go")
				case strings.HasPrefix(sql, "SELECT * FROM keyed_effects_claim("):
					claims = append(claims, "function")
				}
			}
			require.Len(t, claims, 2, "one claim per attempt: %v", claims)
			require.Equal(t, "function", claims[1], "the retry's claim: %v", claims)
		})
	}
}

// runRetried runs the activity name on in from a workflow in Temporal's
// test environment, with two attempts and a millisecond between them, and
// requires it to succeed.
func runRetried(t *testing.T, b *bundle, name string, in orders.OrderInput) {
	t.Helper()
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := suite.NewTestWorkflowEnvironment()
	require.NoError(t, step.Register(env, b.acts.Definitions()...))
	env.ExecuteWorkflow(func(ctx workflow.Context) error {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
			RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 2}})
		return workflow.ExecuteActivity(ctx, name, in).Get(ctx, nil)
	})
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
}
