package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/workflows"
)

// refundStartTimeout bounds refund's direct start: the refund is queued by
// then, and the worker's relay starts it when Temporal is back.
const refundStartTimeout = 10 * time.Second

// refundResult is what refund prints with --json.
type refundResult struct {
	TenantID    string `json:"tenant_id"`
	OrderID     string `json:"order_id"`
	RefundID    string `json:"refund_id"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
	// Requested is false when the same refund was requested before: this
	// call wrote nothing.
	Requested  bool   `json:"requested"`
	WorkflowID string `json:"workflow_id"`
	RunID      string `json:"run_id,omitempty"`
	// Start is "new", "collapsed" (joined the refund's existing run) or
	// "queued" (Temporal could not be reached; the worker's relay starts
	// it).
	Start string `json:"start"`
	// StartError says why the direct start failed, when Start is queued.
	StartError string `json:"start_error,omitempty"`
}

func runRefund(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "refund", "--tenant ID --order ID --refund ID --amount UNITS [--reason TEXT] [--json] [flags]",
		"Requests a refund of a paid order: checks it against the order and what its ledger has refunded,\n"+
			"then commits the request as the refund run's outbox row in one transaction, so the worker's\n"+
			"relay starts it even if this command dies, and starts the run. The refund ID is the business\n"+
			"event: the same refund again starts nothing new; the same ID with another amount is refused.\n"+
			"Prints the workflow ID; when Temporal cannot be reached the start stays queued for the relay.\n"+
			"A refund over what is left of the charge, or of an order that is not paid, is refused (exit 2)\n"+
			"and writes nothing.",
		config.MigrateFlag)
	tenant, order := orderFlags(f)
	refundID := f.String("refund", "", "refund `ID` within the order, such as r1 (required)")
	amount := f.Int64("amount", 0, "amount to refund in minor `units` (cents): 500 is 5.00 (required)")
	reason := f.String("reason", "", "why, in at most 200 bytes of `text`, stored in the ledger and sent to Stripe")
	asJSON := f.Bool("json", false, "print the result as JSON")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	amountSet := ""
	if f.isSet("amount") {
		amountSet = "set"
	}
	if err := requireFlags([][2]string{{"tenant", *tenant}, {"order", *order}, {"refund", *refundID}, {"amount", amountSet}}); err != nil {
		return err
	}
	in := refunds.NewInput(*tenant, *order, *refundID, *amount, *reason)
	if err := in.Validate(); err != nil {
		return usagef("invalid --tenant, --order, --refund, --amount or --reason: %v", err)
	}
	var (
		pool  *pgxpool.Pool
		store *orders.Store
		tc    client.Client
	)
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		var o *orders.Order
		var created bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			o, created, err = refunds.RequestTx(ctx, tx, store, in)
			return err
		})
		if err != nil {
			return refundRefusal(ctx, pool, cfg, in, err)
		}
		res := refundResult{TenantID: in.TenantID, OrderID: in.OrderID, RefundID: in.RefundID, AmountMinor: in.AmountMinor,
			Currency: o.Currency, Requested: created, WorkflowID: in.WorkflowID()}
		startRefund(ctx, cfg, tc, in, o.Currency, &res)
		if res.RunID != "" {
			warnUnpolledQueue(ctx, e.stderr, tc, res.WorkflowID, cfg.Temporal.TaskQueue)
		}
		if *asJSON {
			return writeJSON(e.stdout, res)
		}
		return printRefund(e.stdout, res)
	}, &pool, &store, &tc)
}

// refundRefusal turns RequestTx's refusals into usage errors (exit 2).
func refundRefusal(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, in refunds.RefundInput, err error) error {
	var exceeds *refunds.ExceedsError
	switch {
	case errors.As(err, &exceeds):
		return usagef("refund %s of %d exceeds what is left of order %s/%s: %d charged, %d refunded or in flight, %d left (minor units)",
			in.RefundID, exceeds.AmountMinor, in.TenantID, in.OrderID, exceeds.ChargedMinor, exceeds.RefundedMinor,
			exceeds.ChargedMinor-exceeds.RefundedMinor)
	case errors.Is(err, refunds.ErrNotRefundable):
		return usagef("%v: only a paid order that is not refunded in full can be refunded", err)
	case errors.Is(err, refunds.ErrTooManyRefunds):
		return usagef("order %s/%s has %d refunds, the most one order may have", in.TenantID, in.OrderID, refunds.MaxPerOrder)
	case errors.Is(err, refunds.ErrConflict):
		return usagef("refund %s of order %s/%s was requested with another amount or reason; choose another --refund",
			in.RefundID, in.TenantID, in.OrderID)
	}
	return migrationHint(ctx, pool, cfg, err)
}

// startRefund starts the refund run the way the worker's relay would (the
// same starter and options), which only saves the relay's poll: both land
// on the same workflow ID and collapse. A failure leaves it queued.
func startRefund(ctx context.Context, cfg *config.Config, tc client.Client, in refunds.RefundInput, currency string, res *refundResult) {
	req, err := refunds.StartRequest(in, currency)
	if err == nil {
		ctx, cancel := context.WithTimeout(ctx, refundStartTimeout)
		defer cancel()
		starter := pipeline.Starter(tc, nil, cfg.Temporal.TaskQueue, workflows.Pipelines())
		st, serr := starter.Start(ctx, req)
		if serr == nil {
			res.RunID, res.Start = st.RunID, "new"
			if !st.Created && !res.Requested {
				res.Start = "collapsed"
			}
			return
		}
		err = serr
	}
	res.Start = "queued"
	res.StartError = fmt.Sprintf("start on Temporal at %s: %v", cfg.Temporal.Address, err)
}

func printRefund(w io.Writer, res refundResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	line := fmt.Sprintf("%s of order %s/%s  %s", res.RefundID, res.TenantID, res.OrderID, orders.FormatAmount(res.AmountMinor, res.Currency))
	if res.Requested {
		line += "  (requested)"
	} else {
		line += "  (already requested)"
	}
	fmt.Fprintf(tw, "refund\t%s\n", clean(line))
	fmt.Fprintf(tw, "workflow ID\t%s\n", clean(res.WorkflowID))
	switch res.Start {
	case "queued":
		fmt.Fprintf(tw, "start\tqueued: the worker's relay starts it (%s)\n", clean(res.StartError))
	case "collapsed":
		fmt.Fprintf(tw, "run ID\t%s\n", res.RunID)
		fmt.Fprintf(tw, "start\tcollapsed into existing run\n")
	default:
		fmt.Fprintf(tw, "run ID\t%s\n", res.RunID)
		fmt.Fprintf(tw, "start\tnew\n")
	}
	return tw.Flush()
}
