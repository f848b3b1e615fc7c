package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/orders"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// fieldFlags maps an orders.ValidationError field to the flag that sets it.
var fieldFlags = map[string]string{
	"tenant_id":      "--tenant",
	"order_id":       "--order",
	"amount_minor":   "--amount",
	"currency":       "--currency",
	"customer_email": "--email",
	"payment_method": "--payment-method",
}

// orderFlags binds --tenant and --order.
func orderFlags(f *flags) (tenant, order *string) {
	tenant = f.String("tenant", "", "tenant `ID`, such as acme (required)")
	order = f.String("order", "", "order `ID` within the tenant, such as 9f3a (required)")
	return tenant, order
}

// requireFlags returns a usage error naming every flag in want whose value
// is empty.
func requireFlags(want [][2]string) error {
	var missing []string
	for _, w := range want {
		if strings.TrimSpace(w[1]) == "" {
			missing = append(missing, "--"+w[0])
		}
	}
	if len(missing) > 0 {
		return usagef("missing %s", strings.Join(missing, ", "))
	}
	return nil
}

func runCreate(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "create", "--tenant ID --order ID --amount UNITS --currency CODE --email ADDRESS --payment-method ID [--json] [flags]",
		"Creates the order in Postgres (or finds the identical one already there) together with its\n"+
			"outbox row, so a crash after the commit still ends in a started checkout, and starts its checkout\n"+
			"workflow. Prints the workflow ID, the run ID, and whether this start was new or collapsed into\n"+
			"an existing run. Bad input names the flag and creates nothing.")
	tenant, order := orderFlags(f)
	amount := f.Int64("amount", 0, "amount in minor `units` (cents): 1999 is 19.99 (required)")
	currency := f.String("currency", "", "lower-case ISO 4217 `code`, such as usd or eur (required)")
	email := f.String("email", "", "customer email `address` for the receipt (required)")
	pm := f.String("payment-method", "", "Stripe payment method `ID`, such as pm_card_visa in test mode (required)")
	asJSON := f.Bool("json", false, "print the result as JSON")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	amountSet := ""
	if f.isSet("amount") {
		amountSet = "set"
	}
	if err := requireFlags([][2]string{{"tenant", *tenant}, {"order", *order}, {"amount", amountSet}, {"currency", *currency}, {"email", *email}, {"payment-method", *pm}}); err != nil {
		return err
	}
	cur, err := orders.NormalizeCurrency(*currency)
	if err != nil {
		return validationUsage(err)
	}
	no := orders.NewOrder{
		TenantID: *tenant, ID: *order, AmountMinor: *amount, Currency: cur,
		CustomerEmail: *email, PaymentMethod: *pm,
	}
	if err := no.Validate(); err != nil {
		return validationUsage(err)
	}

	var (
		pool  *pgxpool.Pool
		store *orders.Store
		tc    client.Client
	)
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		// The order and its start request commit together (the outbox), so
		// a crash right after the commit still ends in a started checkout:
		// the worker's relay starts it. The direct start below only saves
		// the relay's poll; both land on the same workflow ID and collapse.
		var o *orders.Order
		var created bool
		// A --task-queue given goes into the outbox row too, so that the
		// relay starts the run where this command does.
		queue := ""
		if f.isSet("task-queue") {
			queue = cfg.Temporal.TaskQueue
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			o, created, err = store.CreateAndEnqueueOnTx(ctx, tx, no, queue)
			return err
		})
		switch {
		case errors.Is(err, orders.ErrConflict):
			return usagef("order %s/%s already exists with a different amount, currency, email or payment method; "+
				"use `starter start` to check out the existing one, or choose another --order", no.TenantID, no.ID)
		case err != nil:
			return migrationHint(ctx, pool, cfg, err)
		}
		return startCheckout(ctx, e, cfg, tc, o, &created, *asJSON)
	}, &pool, &store, &tc)
}

func runStart(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "start", "--tenant ID --order ID [--json] [flags]",
		"Starts the checkout workflow of an order that already exists in Postgres. A start while a run\n"+
			"is in flight joins that run; a start after the order completed starts nothing. A failed order\n"+
			"(its charge was declined) is final and refused: create a new order to charge another card.",
		config.MigrateFlag)
	tenant, order := orderFlags(f)
	asJSON := f.Bool("json", false, "print the result as JSON")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := requireFlags([][2]string{{"tenant", *tenant}, {"order", *order}}); err != nil {
		return err
	}
	if err := orders.NewOrderInput(*tenant, *order).Validate(); err != nil {
		return usagef("invalid --tenant or --order: %v", err)
	}
	var (
		pool  *pgxpool.Pool
		store *orders.Store
		tc    client.Client
	)
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		o, err := store.Get(ctx, *tenant, *order)
		if err != nil {
			return migrationHint(ctx, pool, cfg, err)
		}
		if err := o.CheckRunnable(); err != nil {
			return usagef("%v", err)
		}
		return startCheckout(ctx, e, cfg, tc, o, nil, *asJSON)
	}, &pool, &store, &tc)
}

// startResult is what create and start print with --json.
type startResult struct {
	TenantID string `json:"tenant_id"`
	OrderID  string `json:"order_id"`
	// OrderCreated is set by create only: false when an identical order
	// already existed.
	OrderCreated *bool  `json:"order_created,omitempty"`
	WorkflowID   string `json:"workflow_id"`
	RunID        string `json:"run_id"`
	// Start is "new" or "collapsed" (joined an existing run).
	Start string `json:"start"`
}

func startCheckout(ctx context.Context, e *env, cfg *config.Config, tc client.Client, o *orders.Order, created *bool, asJSON bool) error {
	w := e.stdout
	in := orders.NewOrderInput(o.TenantID, o.ID)
	st, err := orderflow.Start(ctx, tc, in, &orderflow.StartOpts{TaskQueue: cfg.Temporal.TaskQueue, Order: o})
	if err != nil {
		err = fmt.Errorf("start checkout of order %s/%s on Temporal at %s: %w", o.TenantID, o.ID, cfg.Temporal.Address, err)
		if strings.Contains(err.Error(), "no mapping defined for search attribute") {
			err = fmt.Errorf("%w\nregister keyed's search attributes on namespace %q first:\n"+
				"  temporal operator search-attribute create --namespace %s --name TenantID --type Keyword\n"+
				"  temporal operator search-attribute create --namespace %s --name OrderID --type Keyword",
				err, cfg.Temporal.Namespace, cfg.Temporal.Namespace, cfg.Temporal.Namespace)
		}
		return fmt.Errorf("%w\nthe order is saved; once fixed, run: starter start --tenant %s --order %s", err, o.TenantID, o.ID)
	}
	// An order created by this very call can only have a run started from
	// its own outbox row: if the worker's relay got there first, this
	// checkout is still new, not a duplicate.
	warnUnpolledQueue(ctx, e.stderr, tc, st.WorkflowID, cfg.Temporal.TaskQueue)
	isNew := st.Created || (created != nil && *created)
	res := startResult{TenantID: o.TenantID, OrderID: o.ID, OrderCreated: created, WorkflowID: st.WorkflowID, RunID: st.RunID, Start: "new"}
	if !isNew {
		res.Start = "collapsed"
	}
	if asJSON {
		return writeJSON(w, res)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	orderLine := fmt.Sprintf("%s/%s  %d %s  %s", o.TenantID, o.ID, o.AmountMinor, o.Currency, o.Status)
	if created != nil {
		if *created {
			orderLine += "  (created)"
		} else {
			orderLine += "  (already existed)"
		}
	}
	fmt.Fprintf(tw, "order\t%s\n", orderLine)
	fmt.Fprintf(tw, "workflow ID\t%s\n", st.WorkflowID)
	fmt.Fprintf(tw, "run ID\t%s\n", st.RunID)
	if isNew {
		fmt.Fprintf(tw, "start\tnew\n")
	} else {
		fmt.Fprintf(tw, "start\tcollapsed into existing run\n")
	}
	return tw.Flush()
}

// validationUsage turns an *orders.ValidationError into a usage error that
// names the flag.
func validationUsage(err error) error {
	var ve *orders.ValidationError
	if errors.As(err, &ve) {
		if fl, ok := fieldFlags[ve.Field]; ok {
			return usagef("invalid %s: %s", fl, ve.Reason)
		}
	}
	return usagef("%v", err)
}

// migrationHint adds what to do when keyed's tables do not exist where
// DATABASE_URL points: it names the schema searched, and says to point
// DATABASE_URL at the worker's schema before it suggests creating tables.
func migrationHint(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" { // undefined_table
		return err
	}
	where := "the schema searched could not be read"
	var path, schema string
	if qerr := pool.QueryRow(ctx, `SELECT current_setting('search_path'), coalesce(current_schema(), '')`).Scan(&path, &schema); qerr == nil {
		where = fmt.Sprintf("searched schema %q (search_path %s)", schema, path)
		if schema == "" {
			where = fmt.Sprintf("search_path %s names no existing schema", path)
		}
	}
	// Bad configuration, like the worker's and serve's refusal: exit 2.
	return usagef("%v\nkeyed's tables are missing from %s: %s.\n"+
		"Point DATABASE_URL at the database and schema the worker uses (add search_path=SCHEMA; after\n"+
		"`make demo KEEP=1`, run `source .demo/env`). To set keyed up in this schema instead, run `starter migrate`",
		err, cfg.Database.Redacted(), where)
}
