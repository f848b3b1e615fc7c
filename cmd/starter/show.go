package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/workflows"
)

// queryTimeout bounds the workflow query of show: it needs a worker, and
// show must still print the database's view when none is running.
const queryTimeout = 5 * time.Second

// showResult is what show prints with --json.
type showResult struct {
	Order    *orders.Order     `json:"order"`
	Effects  []*effects.Record `json:"effects"`
	Workflow workflowView      `json:"workflow"`
	// Refunds are the order's refunds, oldest request first,
	// RefundedMinor what those whose Stripe refund is recorded sum to (what
	// the order's status counts), and ReservedMinor what those in its
	// ledger that were not released sum to, in flight or refunded.
	Refunds       []shownRefund `json:"refunds"`
	RefundedMinor int64         `json:"refunded_minor"`
	ReservedMinor int64         `json:"reserved_minor"`
	// Runs are the other runs whose steps made the order's effects (its
	// refunds'), as their pipelines map keys to runs, each with its view.
	Runs []workflowView `json:"runs,omitempty"`
}

// shownRefund is a refund as show prints it: how far it got, as State
// says (requested, refused at its reserve with the step's code, reserved,
// refunded, or released with Stripe's refusal code; a failed step shows in
// the effects), and its run's workflow ID.
type shownRefund struct {
	refunds.Refund
	State      string `json:"state"`
	WorkflowID string `json:"workflow_id"`
}

type workflowView struct {
	WorkflowID string                `json:"workflow_id"`
	Steps      []pipeline.StepStatus `json:"steps,omitempty"`
	// Error says why the workflow's view is missing: no run, no worker to
	// answer the query, Temporal unreachable.
	Error string `json:"error,omitempty"`
}

func runShow(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "show", "--tenant ID --order ID [--json] [flags]",
		"Shows the order row, each of its effect records (key, state, attempts, stored outcome or error),\n"+
			"its refunds (amount, state, Stripe refund ID) and, when a worker can answer, the workflow's own view of each step. Stored text that holds control\n"+
			"or invisible characters is printed quoted, with those characters escaped (\\x1b, \\u202e).",
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
	prefix, err := orders.OrderKey(*tenant, *order)
	if err != nil {
		return usagef("invalid --tenant or --order: %v", err)
	}
	var (
		pool  *pgxpool.Pool
		store *orders.Store
		fxc   *effects.Client
		tc    client.Client
	)
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		o, err := store.Get(ctx, *tenant, *order)
		if err != nil {
			return migrationHint(ctx, pool, cfg, err)
		}
		recs, err := store.Effects(ctx, fxc, prefix)
		if err != nil {
			return err
		}
		id := orders.WorkflowID(*tenant, *order)
		res := showResult{Order: o, Effects: recs, Workflow: queryWorkflow(ctx, tc, id), Runs: queryRuns(ctx, tc, recs, id)}
		if res.Effects == nil {
			res.Effects = []*effects.Record{}
		}
		if err := showRefunds(ctx, pool, o, &res); err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(e.stdout, res)
		}
		return printShow(e.stdout, res)
	}, &pool, &store, &fxc, &tc)
}

// queryRuns returns the view of each run, other than the order's own
// (except), that made one of recs, in the order of recs, within one
// queryTimeout for all of them.
func queryRuns(ctx context.Context, tc client.Client, recs []*effects.Record, except string) []workflowView {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var out []workflowView
	seen := map[string]bool{except: true}
	for _, r := range recs {
		k, err := effects.ParseKey(r.Key)
		if err != nil {
			continue
		}
		id, _, ok := pipeline.RunOfKey(workflows.Pipelines(), k)
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, queryWorkflow(ctx, tc, id))
	}
	return out
}

func queryWorkflow(ctx context.Context, tc client.Client, workflowID string) workflowView {
	view := workflowView{WorkflowID: workflowID}
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	val, err := tc.QueryWorkflow(ctx, workflowID, "", pipeline.QueryStatus)
	if err == nil {
		err = val.Get(&view.Steps)
	}
	if err != nil {
		view.Error = err.Error()
		if ctx.Err() != nil {
			view.Error = fmt.Sprintf("no answer within %s (is a worker running? is Temporal reachable?): %v", queryTimeout, err)
		}
	}
	return view
}

func printShow(w io.Writer, res showResult) error {
	o := res.Order
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "order\t%s/%s\n", clean(o.TenantID), clean(o.ID))
	fmt.Fprintf(tw, "  status\t%s\n", clean(string(o.Status)))
	fmt.Fprintf(tw, "  amount\t%d %s (minor units)\n", o.AmountMinor, clean(o.Currency))
	fmt.Fprintf(tw, "  email\t%s\n", clean(o.CustomerEmail))
	fmt.Fprintf(tw, "  payment method\t%s\n", clean(o.PaymentMethod))
	fmt.Fprintf(tw, "  created\t%s\n", o.CreatedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "  updated\t%s\n", o.UpdatedAt.UTC().Format(time.RFC3339))
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\neffects (%d)\n", len(res.Effects))
	if len(res.Effects) > 0 {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  KEY\tSTATE\tATTEMPTS\tOUTCOME\n")
		for _, r := range res.Effects {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", clean(r.Key), r.State, r.Attempts, outcome(r))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if err := printRefunds(w, res); err != nil {
		return err
	}

	for _, v := range append([]workflowView{res.Workflow}, res.Runs...) {
		if err := printWorkflow(w, v); err != nil {
			return err
		}
	}
	return nil
}

// printWorkflow prints a run's view of its steps.
func printWorkflow(w io.Writer, v workflowView) error {
	fmt.Fprintf(w, "\nworkflow %s\n", clean(v.WorkflowID))
	if v.Error != "" {
		fmt.Fprintf(w, "  query unavailable: %s\n", clean(v.Error))
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  STEP\tSTATE\tEFFECT KEY\tERROR\n")
	for _, s := range v.Steps {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", clean(s.Step), clean(s.State), clean(s.EffectKey), clean(s.Error))
	}
	return tw.Flush()
}

// outcome is a record's stored result, its error, or where its claim
// stands, escaped for a terminal.
func outcome(r *effects.Record) string {
	switch {
	case len(r.Result) > 0 && string(r.Result) != "null":
		return clean(string(r.Result))
	case r.ErrorCode != "" || r.ErrorMessage != "":
		return fmt.Sprintf("error %s: %s", clean(r.ErrorCode), clean(r.ErrorMessage))
	case r.State == effects.StateClaimed && r.LeaseUntil != nil:
		return fmt.Sprintf("claimed by %s until %s", clean(r.Owner), r.LeaseUntil.UTC().Format(time.RFC3339))
	}
	return "-"
}

// showRefunds sets res's refunds of order o, what the order has refunded
// (confirmed by Stripe) and what its refunds hold of the charge (reserved,
// not released).
func showRefunds(ctx context.Context, pool *pgxpool.Pool, o *orders.Order, res *showResult) error {
	ledger, err := refunds.NewLedger(pool)
	if err != nil {
		return err
	}
	refs, err := ledger.Refunds(ctx, o.TenantID, o.ID)
	if err != nil {
		return err
	}
	res.Refunds = make([]shownRefund, 0, len(refs))
	for _, r := range refs {
		s := shownRefund{Refund: r, State: "requested",
			WorkflowID: refunds.NewInput(o.TenantID, o.ID, r.RefundID, r.AmountMinor, r.Reason).WorkflowID()}
		switch {
		case r.Stripe != nil:
			s.State = "refunded"
		case r.Release != nil:
			s.State = "released (" + r.Release.Code + ")"
		case r.Entry != nil:
			s.State = "reserved"
		default:
			s.State = refusedAtReserve(res.Effects, o, r.RefundID)
		}
		res.RefundedMinor += r.Refunded()
		res.ReservedMinor += r.Reserved()
		res.Refunds = append(res.Refunds, s)
	}
	return nil
}

// refusedAtReserve is the state of a refund with no ledger row: "refused
// (code)" when its reserve step failed for good (it reserved nothing, so
// it never will), else "requested".
func refusedAtReserve(recs []*effects.Record, o *orders.Order, refundID string) string {
	key, err := refunds.NewInput(o.TenantID, o.ID, refundID, 1, "").EffectKey(refunds.StepReserve)
	if err != nil {
		return "requested"
	}
	for _, rec := range recs {
		if rec.Key == key.String() && rec.State == effects.StateFailedTerminal {
			return "refused (" + rec.ErrorCode + ")"
		}
	}
	return "requested"
}

func printRefunds(w io.Writer, res showResult) error {
	inFlight := ""
	if n := res.ReservedMinor - res.RefundedMinor; n > 0 {
		inFlight = fmt.Sprintf(", %d in flight", n)
	}
	fmt.Fprintf(w, "\nrefunds (%d, %d %s refunded%s)\n", len(res.Refunds), res.RefundedMinor, clean(res.Order.Currency), inFlight)
	if len(res.Refunds) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  REFUND\tAMOUNT\tSTATE\tSTRIPE REFUND\tREASON\n")
	for _, r := range res.Refunds {
		stripeID := "-"
		if r.Stripe != nil {
			stripeID = r.Stripe.RefundID + " (" + r.Stripe.Status + ")"
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\n", clean(r.RefundID), r.AmountMinor, clean(r.State), clean(stripeID), clean(r.Reason))
	}
	return tw.Flush()
}
