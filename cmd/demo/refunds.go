package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/workflows"
	refundflow "github.com/keyedhq/keyed/workflows/refund"
)

// demoRefund is one refund scenario and what happened to it.
type demoRefund struct {
	order  *demoOrder
	id     string
	amount int64
	note   string
	// refused is the request's refusal (nothing queued), and forcedErr how
	// a run started anyway, past the request's check, ended: Reserve
	// refuses it under the order's lock.
	refused   error
	forcedErr error
	started   []*outbox.Started
	result    refunds.Result
	err       error
}

// refundScenarios refunds part of the second paid order, all of the third,
// and then asks the second for more than is left. The first order stays
// paid, as `starter show` finds it in the demo's test.
func refundScenarios(list []*demoOrder) []*demoRefund {
	partial, full := list[1], list[2]
	return []*demoRefund{
		{order: partial, id: "R1", amount: partial.amount / 5, note: "partial refund"},
		{order: full, id: "R1", amount: full.amount, note: "full refund"},
		{order: partial, id: "R2", amount: partial.amount, note: "more than is left"},
	}
}

func (r *demoRefund) input() refunds.RefundInput {
	return refunds.NewInput(tenant, r.order.id, r.id, r.amount, r.note)
}

// runRefunds requests each refund as the API does (checked, queued in the
// outbox with its start in one transaction), fires dups concurrent starts
// at it, and waits for its run; the refused one is then started anyway.
func (s *stack) runRefunds(ctx context.Context, list []*demoRefund, dups int) error {
	s.say("refunding: %d refund requests, %d concurrent starts at each one accepted", len(list), dups)
	for i, r := range list {
		if i == len(list)-1 { // it asks for more than the others left
			if err := s.waitRefunds(ctx, list[:i]); err != nil {
				return err
			}
		}
		if err := s.requestRefund(ctx, r, dups); err != nil {
			return err
		}
	}
	return s.waitRefunds(ctx, list)
}

// requestRefund queues r's start with its check, like POST
// /v1/orders/{id}/refunds, and starts it dups times at once as the relay
// would. A refused request queues nothing; its run is then started
// directly, to show that Reserve refuses it too.
func (s *stack) requestRefund(ctx context.Context, r *demoRefund, dups int) error {
	in := r.input()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		_, _, err := refunds.RequestTx(ctx, tx, s.store, in)
		return err
	})
	var exceeds *refunds.ExceedsError
	switch {
	case errors.As(err, &exceeds) || errors.Is(err, refunds.ErrNotRefundable):
		r.refused = err
		st, err := pipeline.Start(ctx, s.tc, refundflow.StartOptions(in, s.taskQueue), refunds.WorkflowName, in)
		if err != nil {
			return fmt.Errorf("start refused refund %s: %w", in.WorkflowID(), err)
		}
		r.forcedErr = s.await(ctx, st.WorkflowID, st.RunID, runWait, nil)
		if errors.Is(r.forcedErr, errStuck) {
			return r.forcedErr
		}
		return ctx.Err()
	case err != nil:
		return fmt.Errorf("request refund %s: %w", in.WorkflowID(), err)
	}
	req, err := refunds.StartRequest(in, "eur")
	if err != nil {
		return err
	}
	starter := pipeline.Starter(s.tc, s.pool, s.taskQueue, workflows.Pipelines())
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for range dups {
		wg.Go(func() {
			st, err := starter.Start(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			r.started = append(r.started, st)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitRefunds waits for the runs of the accepted refunds in list.
func (s *stack) waitRefunds(ctx context.Context, list []*demoRefund) error {
	for _, r := range list {
		if len(r.started) == 0 || r.err != nil || r.result.Stripe.RefundID != "" {
			continue
		}
		st := r.started[0]
		r.err = s.await(ctx, st.WorkflowID, st.RunID, runWait, &r.result)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(r.err, errStuck) {
			return r.err
		}
	}
	return nil
}

// refundRow is one line of the refunds' table, and its details.
type refundRow struct {
	refund, order, scenario string
	amount                  string
	runs, duplicates        int
	outcome                 string
	refunds                 int // at the fake Stripe; -1 with the real one
	details                 [][2]string
}

// refundRows turns the refund scenarios into the report's rows.
func (s *stack) refundRows(ctx context.Context, list []*demoRefund) ([]refundRow, error) {
	out := make([]refundRow, 0, len(list))
	for _, r := range list {
		row, err := s.refundRow(ctx, r)
		if err != nil {
			return nil, err
		}
		out = append(out, row)
	}
	return out, nil
}

func (s *stack) refundRow(ctx context.Context, r *demoRefund) (refundRow, error) {
	in := r.input()
	row := refundRow{refund: r.id, order: r.order.id, scenario: r.note, amount: orders.FormatAmount(r.amount, "eur"), refunds: -1}
	for _, st := range r.started {
		if st.Created {
			row.runs++
		} else {
			row.duplicates++
		}
	}
	if len(r.started) > 0 && row.runs == 0 {
		row.runs = 1 // the worker's relay started the queued run first
	}
	if s.stripeFake != nil {
		key, err := in.EffectKey(refunds.StepStripe)
		if err != nil {
			return row, err
		}
		row.refunds = s.stripeFake.RefundsForMetadata("effect_key", key.String())
	}
	o, err := s.store.Get(ctx, tenant, r.order.id)
	if err != nil {
		return row, err
	}
	row.outcome, row.details = refundOutcome(r, in)
	prefix, err := effects.NewKey(tenant, "order", r.order.id, "refund", r.id)
	if err != nil {
		return row, err
	}
	states, err := s.statesUnder(ctx, prefix)
	if err != nil {
		return row, err
	}
	row.details = append(row.details, [2]string{"order", string(o.Status) + " after it"}, [2]string{"effects", states})
	return row, nil
}

// refundOutcome says how r ended, and its details.
func refundOutcome(r *demoRefund, in refunds.RefundInput) (string, [][2]string) {
	if r.refused != nil {
		var exceeds *refunds.ExceedsError
		left := ""
		if errors.As(r.refused, &exceeds) {
			left = " (" + orders.FormatAmount(exceeds.ChargedMinor-exceeds.RefundedMinor, "eur") + " left)"
		}
		return "refused", [][2]string{
			{"request", "refused before queueing: exceeds the charge" + left},
			{"forced", in.WorkflowID() + " started anyway: " + failure(r.forcedErr) + " at Reserve"},
		}
	}
	details := [][2]string{{"workflow", in.WorkflowID()}}
	if r.err != nil {
		return "failed: " + failure(r.err), details
	}
	details = append(details, [2]string{"stripe", r.result.Stripe.RefundID + " " + r.result.Stripe.Status},
		[2]string{"ledger", fmt.Sprintf("%s of %s refunded",
			orders.FormatAmount(r.result.Reserve.RefundedMinor, "eur"), orders.FormatAmount(r.result.Reserve.ChargedMinor, "eur"))})
	return "refunded, email sent", details
}

// printRefunds prints the refunds' table, what it means, and each
// refund's details; no line is wider than maxWidth columns.
func printRefunds(w io.Writer, rows []refundRow, dups int, fake bool) error {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	lines := []string{"REFUND\tOF ORDER\tSCENARIO\tAMOUNT\tNEW\tDUPLICATE\tOUTCOME\tREFUNDS"}
	for _, r := range rows {
		refunds := "n/a"
		if r.refunds >= 0 {
			refunds = fmt.Sprint(r.refunds)
		}
		lines = append(lines, fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s", truncate(r.refund, 6), truncate(r.order, 12),
			truncate(r.scenario, 18), r.amount, r.runs, r.duplicates, truncate(r.outcome, 22), refunds))
	}
	if _, err := io.WriteString(tw, strings.Join(lines, "\n")+"\n"); err != nil {
		return err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	legend := fmt.Sprintf(`
Each refund was requested as POST /v1/orders/{id}/refunds does it: checked against the order
and its ledger, then queued with its start in one transaction. Then %d concurrent starts were
fired at it, all with the refund's one workflow ID (refund:tenant:order:refund). NEW is the one
run, begun by one of them or by the worker's outbox relay, which starts a queued refund as soon
as it commits; DUPLICATE counts the starts that joined that run. The last refund asks for more
than is left and is refused before anything is queued; started anyway, its run stops at
Reserve, which sums the ledger under the order's lock.
`, dups)
	if fake {
		legend += "REFUNDS counts the refunds the fake Stripe made for each: one, whatever the starts, and none\nfor the refused one.\n"
	}
	if _, err := io.WriteString(w, "\n"+b.String()+legend); err != nil {
		return err
	}
	for _, r := range rows {
		if _, err := fmt.Fprintf(w, "\n%s of %s\n", r.refund, r.order); err != nil {
			return err
		}
		for _, l := range r.details {
			if _, err := fmt.Fprintf(w, "  %-9s %s\n", l[0], truncate(l[1], maxWidth-12)); err != nil {
				return err
			}
		}
	}
	return nil
}
