package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// demoOrder is one scenario and what happened to it.
type demoOrder struct {
	id, pm, note string
	amount       int64
	fault        *fakestripe.Fault
	started      []*outbox.Started
	result       orders.OrderResult
	// err is the run's failure, such as the declined card.
	err error
	// later is the start fired after the run finished; rerunErr is how the
	// run it started, if any, ended.
	later    *outbox.Started
	rerunErr error
}

func scenarios(stamp string) []*demoOrder {
	return []*demoOrder{
		{id: "A-" + stamp, pm: "pm_card_visa", amount: 1250, note: "happy path"},
		{id: "B-" + stamp, pm: "pm_card_visa", amount: 4999, note: "charge response lost",
			fault: &fakestripe.Fault{Kind: fakestripe.FaultDropResponse, Times: 2, Match: "B-" + stamp}},
		{id: "C-" + stamp, pm: "pm_card_visa", amount: 300, note: "Stripe 500 first",
			fault: &fakestripe.Fault{Kind: fakestripe.FaultServerError, Times: 1, Match: "C-" + stamp}},
		{id: "D-" + stamp, pm: "pm_card_chargeDeclined", amount: 800, note: "card declined"},
	}
}

// runScenarios creates each order, fires dups concurrent starts at it,
// waits for the runs, then fires one more start at each finished order.
func (s *stack) runScenarios(ctx context.Context, list []*demoOrder, dups int) error {
	s.say("creating %d orders and firing %d concurrent starts at each", len(list), dups)
	for _, o := range list {
		if err := s.createAndStart(ctx, o, dups); err != nil {
			return err
		}
	}
	s.say("waiting for the runs to finish")
	for _, o := range list {
		st := o.started[0]
		o.err = s.await(ctx, st.WorkflowID, st.RunID, runWait, &o.result)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(o.err, errStuck) {
			return o.err
		}
	}
	s.say("firing one more start at every finished order")
	for _, o := range list {
		if err := s.startLater(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

// createAndStart creates the order o, with its Stripe fault injected if
// it has one, and fires dups concurrent starts at it.
func (s *stack) createAndStart(ctx context.Context, o *demoOrder, dups int) error {
	if o.fault != nil && s.stripeFake != nil {
		s.stripeFake.Inject(*o.fault)
	}
	ord, _, err := s.store.Create(ctx, orders.NewOrder{TenantID: tenant, ID: o.id, AmountMinor: o.amount, Currency: "eur",
		CustomerEmail: "ada@example.com", PaymentMethod: o.pm})
	if err != nil {
		return fmt.Errorf("create order %s: %w", o.id, err)
	}
	if err := s.startConcurrently(ctx, o, ord, dups); err != nil {
		return fmt.Errorf("start %s: %w", o.id, err)
	}
	return nil
}

// startConcurrently fires dups starts at the order at once, records each
// in o.started, and returns every start's error.
func (s *stack) startConcurrently(ctx context.Context, o *demoOrder, ord *orders.Order, dups int) error {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for range dups {
		wg.Go(func() {
			st, err := s.startOrder(ctx, o.id, ord)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			o.started = append(o.started, st)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// startOrder starts the order's run with pipeline.Start, the amount in
// its summary when ord is set.
func (s *stack) startOrder(ctx context.Context, id string, ord *orders.Order) (*outbox.Started, error) {
	return orderflow.Start(ctx, s.tc, orders.NewOrderInput(tenant, id), &orderflow.StartOpts{TaskQueue: s.taskQueue, Order: ord})
}

// startLater fires a start at a finished order: refused for a paid order;
// a failed one may start a new run (a deliberate re-run), whose charge step
// refuses a failed order without calling Stripe.
func (s *stack) startLater(ctx context.Context, o *demoOrder) error {
	st, err := s.startOrder(ctx, o.id, nil)
	if err != nil {
		return fmt.Errorf("later start %s: %w", o.id, err)
	}
	o.later = st
	if st.Created {
		o.rerunErr = s.await(ctx, st.WorkflowID, st.RunID, runWait, nil)
		if errors.Is(o.rerunErr, errStuck) {
			return o.rerunErr
		}
	}
	return ctx.Err()
}

// row is one line of the report.
type row struct {
	order, scenario  string
	runs, duplicates int
	later, outcome   string
	charges          int // at the fake Stripe; -1 with the real one
	workflowID       string
	charge, receipt  string
	effects          string
}

// rows turns the scenarios into the report's rows, reading each order's
// effect records.
func (s *stack) rows(ctx context.Context, list []*demoOrder) ([]row, error) {
	out := make([]row, 0, len(list))
	for _, o := range list {
		r, err := s.row(ctx, o)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// row is the report's row for o.
func (s *stack) row(ctx context.Context, o *demoOrder) (row, error) {
	r := row{order: o.id, scenario: o.note, workflowID: o.started[0].WorkflowID, charges: -1, later: "refused"}
	for _, st := range o.started {
		if st.Created {
			r.runs++
		} else {
			r.duplicates++
		}
	}
	r.outcome, r.charge, r.receipt = outcomeOf(o)
	if o.later.Created {
		r.later = "re-ran: " + failure(o.rerunErr)
	}
	if s.stripeFake != nil {
		r.charges = s.stripeFake.ChargesForMetadata("order_id", o.id)
	}
	var err error
	r.effects, err = s.effectStates(ctx, o.id)
	return r, err
}

// effectStates lists the order's effect records as "charge=succeeded …".
func (s *stack) effectStates(ctx context.Context, orderID string) (string, error) {
	prefix, err := orders.OrderKey(tenant, orderID)
	if err != nil {
		return "", err
	}
	states, err := s.statesUnder(ctx, prefix)
	if err != nil {
		return "", err
	}
	// The order's refunds have their own lines.
	var own []string
	for st := range strings.FieldsSeq(states) {
		if !strings.HasPrefix(st, "refund") {
			own = append(own, st)
		}
	}
	return strings.Join(own, " "), nil
}

// statesUnder lists the effect records under prefix as "charge=succeeded …",
// with the self-guarded steps' transitions (orders.Store.Effects).
func (s *stack) statesUnder(ctx context.Context, prefix effects.Key) (string, error) {
	recs, err := s.store.Effects(ctx, s.claims, prefix)
	if err != nil {
		return "", fmt.Errorf("list effects of %s: %w", prefix, err)
	}
	if len(recs) == 0 {
		return "none", nil
	}
	states := make([]string, len(recs))
	for i, rec := range recs {
		states[i] = rec.Kind + "=" + string(rec.State)
	}
	return strings.Join(states, " "), nil
}

// outcomeOf says how an order's run ended, with its charge and receipt.
func outcomeOf(o *demoOrder) (outcome, charge, receipt string) {
	if o.err != nil {
		return "failed: " + failure(o.err), "none", "not sent"
	}
	charge = o.result.Charge.PaymentIntentID + " " + o.result.Charge.Status
	receipt = o.result.Receipt.MessageID
	if o.result.Receipt.Collapsed {
		receipt = "collapsed (a repeat within the window)"
	}
	return "paid, receipt sent", charge, receipt
}

// failure names a run's failure by its error type (CardDeclined), or
// "succeeded" for nil.
func failure(err error) string {
	if err == nil {
		return "succeeded"
	}
	var app *temporal.ApplicationError
	if errors.As(err, &app) && app.Type() != "" {
		return app.Type()
	}
	return truncate(err.Error(), 40)
}

func truncate(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
