package effects_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
)

// ExampleMigrator creates the effects tables. Run it when a service starts,
// or from its own migration step; a second run finds nothing to do.
func ExampleMigrator() {
	ctx := context.Background()
	pool, drop := effectstest.NewExamplePool(ctx)
	defer drop()

	migrator, err := effects.NewMigrator(pool, nil)
	if err != nil {
		panic(err)
	}
	pending, err := migrator.Pending(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("pending:", pending)
	for range 2 {
		applied, err := migrator.Migrate(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Println("applied:", applied)
	}
	// Output:
	// pending: [1 2 3 4 5 6 7]
	// applied: [1 2 3 4 5 6 7]
	// applied: []
}

// ExampleDo charges a card once, though the step runs twice: the second
// run returns the stored outcome without calling the provider.
func ExampleDo() {
	ctx := context.Background()
	_, client, done := exampleClient(ctx)
	defer done()

	key := effects.MustKey("acme", "order", "9f3a", "charge")
	calls := 0
	charge := func(ctx context.Context, claim *effects.Claim) (string, error) {
		calls++ // The provider call, with claim.Key.String() as its idempotency key.
		return "pi_123", nil
	}
	for range 2 { // A retry after the worker died before reporting.
		id, err := effects.Do(ctx, client, effects.ClaimParams{Key: key, Owner: "order-9f3a/charge"}, charge, nil)
		if err != nil {
			panic(err)
		}
		fmt.Println("charge:", id)
	}
	fmt.Println("provider calls:", calls)
	// Output:
	// charge: pi_123
	// charge: pi_123
	// provider calls: 1
}

// ExampleDoTx credits an account once per refund event: the credit and its
// effect record commit together, so a redelivered event adds nothing.
func ExampleDoTx() {
	ctx := context.Background()
	pool, client, done := exampleClient(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE balances (account text PRIMARY KEY, cents bigint NOT NULL);
		INSERT INTO balances VALUES ('acme', 0)`); err != nil {
		panic(err)
	}

	key := effects.MustKey("acme", "refund", "r-77", "credit")
	credit := func(ctx context.Context, tx pgx.Tx, claim *effects.Claim) (int64, error) {
		var cents int64
		err := tx.QueryRow(ctx, `UPDATE balances SET cents = cents + 500 WHERE account = 'acme' RETURNING cents`).Scan(&cents)
		return cents, err
	}
	for range 2 { // The same event, delivered twice.
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			cents, err := effects.DoTx(ctx, client, tx, effects.ClaimParams{Key: key, Owner: "refund-r-77"}, credit)
			fmt.Println("balance after the credit:", cents)
			return err
		})
		if err != nil {
			panic(err)
		}
	}
	// Output:
	// balance after the credit: 500
	// balance after the credit: 500
}

// ExampleClient_ClaimTx spells out what DoTx does: claim in the caller's
// transaction, act unless the claim is Done, and complete in the same
// transaction.
func ExampleClient_ClaimTx() {
	ctx := context.Background()
	pool, client, done := exampleClient(ctx)
	defer done()

	key := effects.MustKey("acme", "order", "9f3a", "ship")
	ship := func(tx pgx.Tx) error {
		claim, err := client.ClaimTx(ctx, tx, effects.ClaimParams{Key: key, Owner: "order-9f3a/ship"})
		if err != nil {
			return err
		}
		if claim.Done {
			var label string
			if err := claim.Decode(&label); err != nil {
				return err
			}
			fmt.Println("already shipped with", label)
			return nil
		}
		fmt.Println("shipping") // The writes the effect stands for go here, in tx.
		return client.CompleteTx(ctx, tx, claim, "label-1")
	}
	for range 2 {
		if err := pgx.BeginFunc(ctx, pool, ship); err != nil {
			panic(err)
		}
	}
	// Output:
	// shipping
	// already shipped with label-1
}

// ExampleClient_Claim_notBefore claims an order's charge told when the
// order was created, as the database stored it: the claim looks for the
// key only in the leaves from an hour before then on. A time taken at the
// call could let a key claimed before it be claimed again; one hours ahead
// of the claim is refused.
func ExampleClient_Claim_notBefore() {
	ctx := context.Background()
	pool, client, done := exampleClient(ctx)
	defer done()

	var created time.Time // the order's created_at, read with the order
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&created); err != nil {
		panic(err)
	}
	key := effects.MustKey("acme", "order", "9f3a", "charge")
	for _, owner := range []string{"order-9f3a/charge", "order-9f3a/charge-again"} {
		claim, err := client.Claim(ctx, effects.ClaimParams{Key: key, Owner: owner, NotBefore: created})
		if err != nil {
			panic(err)
		}
		if claim.Done {
			fmt.Println("already charged:", string(claim.Result))
			continue
		}
		if err := client.Complete(ctx, claim, map[string]string{"payment_intent": "pi_1"}); err != nil {
			panic(err)
		}
		fmt.Println("charged")
	}
	_, err := client.Claim(ctx, effects.ClaimParams{Key: key, Owner: "late", NotBefore: time.Now().Add(2 * time.Hour)})
	fmt.Println(errors.Is(err, effects.ErrLateNotBefore))
	// Output:
	// charged
	// already charged: {"payment_intent": "pi_1"}
	// true
}

// ExampleClient_ReleaseClaim gives a key up at once after the database
// effect it stood for rolled back, as an HTTP handler does for a request
// that stored nothing: the retry claims the key anew instead of waiting for
// the lease to run out.
func ExampleClient_ReleaseClaim() {
	ctx := context.Background()
	pool, client, done := exampleClient(ctx)
	defer done()

	key := effects.MustKey("acme", "idempotency", "req-7")
	claim, err := client.Claim(ctx, effects.ClaimParams{Key: key, Owner: "request-1"})
	if err != nil {
		panic(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := client.CompleteTx(ctx, tx, claim, "201 Created"); err != nil {
			return err
		}
		return fmt.Errorf("the handler's write failed") // tx rolls back
	})
	fmt.Println("request 1:", err)
	released, err := client.ReleaseClaim(ctx, claim)
	if err != nil {
		panic(err)
	}
	fmt.Println("released:", released)

	retry, err := client.Claim(ctx, effects.ClaimParams{Key: key, Owner: "request-2"})
	if err != nil {
		panic(err)
	}
	fmt.Println("request 2 claims:", retry.Mode)
	// Output:
	// request 1: the handler's write failed
	// released: true
	// request 2 claims: new
}

// ExampleClient_SetLifetimes keeps charges 180 days and everything else
// 30, with each lifetime cut into six leaves, so that a busy deployment's
// retention drops smaller leaves (docs/operating.md, "Sizing leaves").
func ExampleClient_SetLifetimes() {
	ctx := context.Background()
	_, client, done := exampleClient(ctx)
	defer done()

	const day = 24 * time.Hour
	lifetimes := []effects.Lifetime{{Kind: "", Keep: 30 * day}, {Kind: "charge", Keep: 180 * day}}
	if err := client.SetLifetimes(ctx, lifetimes, &effects.SetLifetimesOpts{LeavesPerLifetime: 6}); err != nil {
		panic(err)
	}
	leaves, err := client.Leaves(ctx)
	if err != nil {
		panic(err)
	}
	for _, l := range leaves {
		if l.Class == "charge" { // One leaf, or two near a boundary: print the first.
			fmt.Printf("%s: %.0f days wide, its records kept %.0f days after it ends\n",
				l.Class, l.To.Sub(l.From).Hours()/24, l.Keep.Hours()/24)
			break
		}
	}
	err = client.SetLifetimes(ctx, lifetimes, &effects.SetLifetimesOpts{LeavesPerLifetime: 17})
	fmt.Println(errors.Is(err, effects.ErrLifetime))
	// Output:
	// charge: 30 days wide, its records kept 180 days after it ends
	// true
}

// exampleClient returns a pool on a new schema with the effects tables, a
// Client on it, and a function that drops the schema.
func exampleClient(ctx context.Context) (*pgxpool.Pool, *effects.Client, func()) {
	pool, drop := effectstest.NewExamplePool(ctx)
	migrator, err := effects.NewMigrator(pool, nil)
	if err != nil {
		panic(err)
	}
	if _, err := migrator.Migrate(ctx); err != nil {
		panic(err)
	}
	client, err := effects.NewClient(pool, nil)
	if err != nil {
		panic(err)
	}
	return pool, client, drop
}

// ExampleOldestFirstSQL prunes a table of the application's own: rows
// sent more than a day ago go, oldest first, two a statement here (1000 is
// usual), and unsent rows stay.
func ExampleOldestFirstSQL() {
	ctx := context.Background()
	pool, drop := effectstest.NewExamplePool(ctx)
	defer drop()

	_, err := pool.Exec(ctx, `CREATE TABLE notices (id int, sent_at timestamptz);
INSERT INTO notices SELECT i, CASE WHEN i <= 5 THEN now() - interval '2 days' END FROM generate_series(1, 8) i`)
	if err != nil {
		panic(err)
	}
	sql := effects.OldestFirstSQL("notices", `sent_at < now() - $1 * interval '1 microsecond'`, "sent_at", 2)
	n, err := effects.DeleteInBatches(ctx, pool, 2, sql, (24 * time.Hour).Microseconds())
	if err != nil {
		panic(err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM notices`).Scan(&left); err != nil {
		panic(err)
	}
	fmt.Println("deleted:", n, "left:", left)
	// Output:
	// deleted: 5 left: 3
}
