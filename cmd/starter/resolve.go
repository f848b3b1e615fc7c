package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	stripeclient "github.com/stripe/stripe-go/v76/client"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
	"github.com/keyedhq/keyed/workflows"
)

func runResolve(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "resolve", "--key KEY --as done|retry --reason TEXT [--result JSON] [--unverified] [--by NAME] [--json] [flags]",
		"Settles an effect whose outcome keyed cannot know: an at-most-once receipt that failed as\n"+
			"\"ambiguous\", a charge whose key came back with other inputs, a terminal failure that a fix has made\n"+
			"worth retrying, or a claim whose owner died. Check the provider first (Stripe: metadata effect_key;\n"+
			"SendGrid: custom_args effect_key), then:\n"+
			"  --as done   it happened: --result is its outcome, which later runs replay without acting\n"+
			"  --as retry  it did not happen: the next run acts again\n"+
			"A done needs the step's outcome as --result, such as '{\"payment_intent_id\":\"pi_…\",\"status\":\"succeeded\",\n"+
			"\"amount_minor\":2500,\"currency\":\"eur\"}' for a charge or '{\"message_id\":\"…\"}' for a receipt, and is checked\n"+
			"against the provider before anything changes: the PaymentIntent, refund or message must exist under the\n"+
			"key, succeeded, for the amount. A contradicted done is refused; one whose provider cannot be asked is\n"+
			"refused too unless --unverified, which the record keeps. A done is refused as well for an effect whose\n"+
			"step refused for good (an invalid state, a decline, the provider's refusal): it did not happen.\n"+
			"When the run of the key's order or refund waits for this decision (KeyedAttention, see\n"+
			"'starter attention'), resolve sends it the decide update: the run checks and applies it, fenced and\n"+
			"audited with --by, and continues in the same run. While that run runs and waits for nothing it\n"+
			"settles the step itself, and resolve refuses (exit 2). If Temporal cannot be asked it exits 1, and if the\n"+
			"namespace has no run of the key although its record changed within the namespace's retention (a wrong\n"+
			"TEMPORAL_NAMESPACE?) it refuses (exit 2): both change nothing. Once the run has closed, or was deleted\n"+
			"after its retention, it checks and settles the record alone, asking Stripe with STRIPE_SECRET_KEY\n"+
			"(STRIPE_API_BASE) and SendGrid with SENDGRID_API_KEY (SENDGRID_API_BASE) from the environment; then\n"+
			"re-run the order's checkout with 'starter start' (a refund: 'starter refund'). Live claims and\n"+
			"succeeded effects are refused, and so is every effect of a failed order (a declined charge): a failed\n"+
			"order is final. A refused decision exits 2 and says why.",
		config.MigrateFlag)
	key := f.String("key", "", "the effect `key`, such as acme:order:9f3a:receipt (required)")
	as := f.String("as", "", "the `outcome`: done (it happened) or retry (it did not) (required)")
	reason := f.String("reason", "", fmt.Sprintf("why, kept on the record: one line of printable `text`, at most %d bytes (required)", pipeline.MaxDecisionReason))
	result := f.String("result", "", fmt.Sprintf("with --as done, required: the step's outcome, as `JSON` of at most %d bytes,\n"+
		"such as '{\"message_id\":\"…\"}'", effects.MaxResultBytes))
	unverified := f.Bool("unverified", false, "with --as done: apply it even when the provider cannot be asked (an outage, a key\n"+
		"without the look-up's scope); the record keeps that it was not verified")
	asJSON := f.Bool("json", false, "print the record (or the decision) as JSON")
	by := f.String("by", "", fmt.Sprintf("who decides: a `name` kept on the record, one line of printable text of at most %d bytes (default $USER)", pipeline.MaxDecisionBy))
	batch := batchFlags(f)
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	if *by == "" {
		*by, _ = e.lookup("USER")
	}
	if *batch.query != "" {
		if *key != "" || *result != "" {
			return usagef("--query decides every run it lists: give no --key and no --result (a done takes each run's outcome from its provider)")
		}
		return runResolveQuery(ctx, e, f, cfg, batch, pipeline.Decision{Resolution: effects.Resolution(*as), Reason: *reason, By: *by, Unverified: *unverified}, *asJSON)
	}
	if f.isSet("dry-run") || f.isSet("rate") || f.isSet("step") {
		return usagef("--dry-run, --rate and --step go with --query only; with --key, resolve decides at once")
	}
	k, d, err := decisionOf(*key, *as, *reason, *result, *by, f.isSet("result"), *unverified)
	if err != nil {
		return err
	}
	var (
		pool  *pgxpool.Pool
		fxc   *effects.Client
		store *orders.Store
		tc    client.Client
	)
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		if err := refuseFinalOrder(ctx, store, k); err != nil {
			return migrationHint(ctx, pool, cfg, err)
		}
		decided, err := decideWaitingRun(ctx, cfg, tc, fxc, k, d)
		if err != nil || decided != nil {
			return printDecision(e, decided, err, *asJSON)
		}
		rec, err := resolveRecord(ctx, cfg, pool, fxc, store, k, d)
		if err != nil {
			return migrationHint(ctx, pool, cfg, err)
		}
		if *asJSON {
			return writeJSON(e.stdout, rec)
		}
		_, err = fmt.Fprintf(e.stdout, "%s is now %s (%s)\n", clean(rec.Key), rec.State, clean(rec.ErrorMessage))
		return err
	}, &pool, &fxc, &store, &tc)
}

// decisionOf checks resolve's flags and returns the key and the decision
// on its step, or a usage error naming every problem at once: the key's,
// then pipeline.CheckDecision's under the step's declared outcome, in
// flags' names.
func decisionOf(key, as, reason, result, by string, resultSet, unverified bool) (effects.Key, pipeline.Decision, error) {
	var problems []string
	k, err := effects.ParseKey(key)
	switch {
	case strings.TrimSpace(key) == "":
		problems = append(problems, "--key is required")
	case err != nil:
		problems = append(problems, fmt.Sprintf("invalid --key: %v", err))
	}
	d := pipeline.Decision{Resolution: effects.Resolution(as), Reason: reason, By: by, Unverified: unverified}
	if resultSet {
		d.Result = json.RawMessage(result)
	}
	var outcome step.Outcome
	if err == nil {
		d.Step = stepOfKey(k)
		outcome = declaredOutcome(d.Step)
	}
	var invalid *pipeline.DecisionError
	if errors.As(pipeline.CheckDecision(d, d.Step, outcome), &invalid) {
		for _, p := range invalid.Problems {
			problems = append(problems, flagProblem(p, d))
		}
	}
	if problems != nil {
		return k, d, usagef("%s", strings.Join(problems, "; "))
	}
	return k, d, nil
}

// flagProblem renders a decision's problem in resolve's flags.
func flagProblem(p pipeline.Problem, d pipeline.Decision) string {
	switch p.Field {
	case "resolution":
		if d.Resolution == "" {
			return "--as is required: done or retry"
		}
		return fmt.Sprintf("invalid --as %q: want done or retry", d.Resolution)
	case "by":
		return "--by " + p.Text + " (it defaults to $USER)"
	case "step":
		return "--key " + p.Text
	}
	return "--" + p.Field + " " + p.Text
}

// stepOfKey returns the step whose effect k is: the key's last part.
func stepOfKey(k effects.Key) string {
	parts := k.Parts()
	return parts[len(parts)-1]
}

// declaredOutcome returns the declared Outcome of the step named step in
// any pipeline, or nil for a step none declares.
func declaredOutcome(name string) step.Outcome {
	for _, s := range workflows.Pipelines() {
		for _, d := range s.Steps {
			if d.Step == name {
				return d.Outcome
			}
		}
	}
	return nil
}

// decideWaitingRun sends d to the run that makes k's effect, an order's or
// a refund's (runOfKey), when it waits on k's step, and returns what the
// run applied. It returns nil and no error when no run can settle the step
// (the run has closed, or is gone: runGone), so that the caller settles the
// record alone; a usage error when the run is open but waits for nothing,
// waits on another step or refuses the decision, or when the namespace
// should hold the run and does not; and an error when Temporal cannot be
// asked, since a record settled beside a waiting run leaves it waiting.
func decideWaitingRun(ctx context.Context, cfg *config.Config, tc client.Client, fxc *effects.Client, k effects.Key, d pipeline.Decision) (*pipeline.DecisionResult, error) {
	id, keyStep, ok := runOfKey(k)
	if !ok {
		return nil, nil
	}
	askCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	w, err := pipeline.WaitOf(askCtx, tc, id)
	var notFound *serviceerror.NotFound
	switch {
	case errors.Is(err, pipeline.ErrRunning):
		return nil, usagef("the run %s is still running and does not wait for a decision: it settles %s itself, "+
			"and a decision written beside it would race it; nothing changed. Decide once it waits (starter attention) or has ended", id, keyStep)
	case errors.Is(err, pipeline.ErrNotWaiting):
		return nil, nil
	case errors.As(err, &notFound):
		return nil, runGone(askCtx, cfg.Temporal.Namespace, tc, fxc, k, id)
	case err != nil:
		return nil, fmt.Errorf("ask Temporal whether the run %s waits for this decision: %w; nothing changed: "+
			"a record settled beside a waiting run would leave it waiting, so retry once Temporal answers", id, err)
	}
	if w.Step != keyStep {
		return nil, usagef("the run %s waits on %s (%s), not on %s: decide that step", id, w.Step, w.Attention, keyStep)
	}
	d.Wait = w.Wait
	res, err := pipeline.SendDecision(ctx, tc, id, w.RunID, d)
	if err != nil {
		return nil, usagef("the waiting run %s refused the decision: %s", id, failureMessage(err))
	}
	return res, nil
}

// runGone returns nil when namespace has no run id because it was deleted:
// k's record (or its absence, which resolveRecord reports) last changed
// longer ago than the namespace's retention, so a run that made it has
// closed and been removed since. Otherwise the namespace should still hold
// that run, and it is probably the wrong one: a usage error.
func runGone(ctx context.Context, namespace string, tc client.Client, fxc *effects.Client, k effects.Key, id string) error {
	rec, err := fxc.Get(ctx, k)
	if errors.Is(err, effects.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", k, err)
	}
	ns, err := tc.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("read namespace %s's retention: %w; nothing changed", namespace, err)
	}
	retention := ns.GetConfig().GetWorkflowExecutionRetentionTtl().AsDuration()
	since := time.Since(rec.UpdatedAt)
	if since > retention {
		return nil
	}
	return usagef("namespace %s has no run %s, yet %s changed %s ago, within the namespace's retention (%s): "+
		"the run that made it would still be there. Is TEMPORAL_NAMESPACE (--temporal-namespace) the one the workers use? Nothing changed",
		namespace, id, k, since.Round(time.Second), retention)
}

// failureMessage returns the message of the application error in err's
// chain (the validator's or ApplyDecision's reason, without the SDK's
// envelope), or err's text.
func failureMessage(err error) string {
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		return app.Message()
	}
	return err.Error()
}

// resolveRecord applies d to k's record when no run waits for it, with a
// pipeline.Decider over every pipeline's checks (asking Stripe and SendGrid
// when their keys are configured), and returns the record after
// it. A refused decision, a record that cannot be resolved and a missing
// one are usage errors.
func resolveRecord(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, fxc *effects.Client, store *orders.Store,
	k effects.Key, d pipeline.Decision) (*effects.Record, error) {
	if err := refuseSucceeded(ctx, fxc, k, d); err != nil {
		return nil, err
	}
	decider, err := newDecider(cfg, pool, fxc)
	if err != nil {
		return nil, err
	}
	res, err := decider.Apply(ctx, pipeline.DecisionInput{EffectKey: k.String(), Step: d.Step, Resolution: d.Resolution,
		Result: d.Result, Reason: strings.TrimSpace(d.Reason), By: strings.TrimSpace(d.By), Unverified: d.Unverified, Via: "starter resolve"})
	var refused *pipeline.RefusedError
	switch {
	case errors.As(err, &refused), errors.Is(err, effects.ErrNotResolvable):
		return nil, usagef("%v", err)
	case err != nil:
		return nil, err
	case res.State == "absent":
		return nil, usagef("resolve %s: %v: no effect record under this key, nothing to retry", k, effects.ErrNotFound)
	}
	rec, err := fxc.Get(ctx, k)
	if errors.Is(err, effects.ErrNotFound) && len(k.Parts()) > 2 {
		// A self-guarded step stores no record: its transition is its record.
		return ownWrite(ctx, store, fxc, k)
	}
	return rec, err
}

// refuseSucceeded refuses a done on a record that already succeeded, as a
// retry is refused: the decider would keep the stored outcome and report
// success, whatever d's result says.
func refuseSucceeded(ctx context.Context, fxc *effects.Client, k effects.Key, d pipeline.Decision) error {
	if d.Resolution != effects.ResolveDone {
		return nil
	}
	rec, err := fxc.Get(ctx, k)
	switch {
	case errors.Is(err, effects.ErrNotFound):
		return nil
	case err != nil:
		return err
	case rec.State == effects.StateSucceeded:
		return usagef("resolve %s: %v: it is succeeded with the outcome %s; nothing changed",
			k, effects.ErrNotResolvable, clean(string(rec.Result)))
	}
	return nil
}

// ownWrite returns the record orders.Store.Effects makes of the
// transition under k, a self-guarded order step's key.
func ownWrite(ctx context.Context, store *orders.Store, fxc *effects.Client, k effects.Key) (*effects.Record, error) {
	prefix, err := effects.NewKey(k.Tenant(), k.Parts()[:2]...)
	if err != nil {
		return nil, err
	}
	recs, err := store.Effects(ctx, fxc, prefix)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if r.Key == k.String() {
			return r, nil
		}
	}
	return nil, fmt.Errorf("resolve %s: %w", k, effects.ErrNotFound)
}

// lookupOnlyFrom is the From of the SendGrid client resolve makes when
// RECEIPT_FROM is not set: it only looks messages up and never sends.
const lookupOnlyFrom = "keyed-resolve@localhost.invalid"

// newDecider returns a Decider over every pipeline's checks, with a Stripe
// client when STRIPE_SECRET_KEY is set and a
// SendGrid client when SENDGRID_API_KEY is: without one, the checks that
// need it find the provider unverifiable, naming the missing setting.
func newDecider(cfg *config.Config, pool *pgxpool.Pool, fxc *effects.Client) (*pipeline.Decider, error) {
	d, err := providerDeps(cfg, pool, fxc)
	if err != nil {
		return nil, err
	}
	return pipeline.NewDeciderOf(workflows.Pipelines(), d)
}

// providerDeps returns the pipelines' Deps with a Stripe client when
// STRIPE_SECRET_KEY is set and a SendGrid client (that only looks up)
// when SENDGRID_API_KEY is.
func providerDeps(cfg *config.Config, pool *pgxpool.Pool, fxc *effects.Client) (pipeline.Deps, error) {
	var sc *stripeclient.API
	if key := string(cfg.Stripe.SecretKey); key != "" {
		var err error
		if sc, err = stripestep.NewClient(key, cfg.Stripe.APIBase, nil); err != nil {
			return pipeline.Deps{}, usagef("STRIPE_SECRET_KEY, STRIPE_API_BASE: %v", err)
		}
	}
	var sender *notify.Sender
	if key := string(cfg.SendGrid.APIKey); key != "" {
		from := cmp.Or(cfg.Receipt.From, lookupOnlyFrom)
		var err error
		sender, err = notify.NewSender(fxc, pool, &notify.SenderOpts{APIKey: key, BaseURL: cfg.SendGrid.APIBase, From: from})
		if err != nil {
			return pipeline.Deps{}, usagef("SENDGRID_API_KEY, SENDGRID_API_BASE, RECEIPT_FROM: %v", err)
		}
	}
	d := pipeline.Deps{DB: pool, Effects: fxc}
	if sc != nil {
		d.Providers = append(d.Providers, sc)
	}
	if sender != nil {
		d.Providers = append(d.Providers, sender)
	}
	return d, nil
}

// runOfKey returns the workflow ID of the run whose step makes the effect
// k, and that step, as the pipeline that owns k's shape derives it.
func runOfKey(k effects.Key) (id, stepName string, ok bool) {
	return pipeline.RunOfKey(workflows.Pipelines(), k)
}

// printDecision prints a decision the waiting run applied, or err.
func printDecision(e *env, d *pipeline.DecisionResult, err error, asJSON bool) error {
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, d)
	}
	checked := ""
	if d.Verification != "" {
		checked = ", " + clean(d.Verification)
	}
	_, err = fmt.Fprintf(e.stdout, "%s decided %s in the waiting run: the record is now %s (generation %d%s) and the run continues\n",
		clean(d.EffectKey), d.Resolution, d.State, d.Generation, checked)
	return err
}

// refuseFinalOrder returns a usage error when k is an effect of a failed
// order: a failed order is final (orders.ErrFinal), so neither resolution
// may overwrite what its charge stored.
func refuseFinalOrder(ctx context.Context, store *orders.Store, k effects.Key) error {
	parts := k.Parts()
	if len(parts) != 3 || parts[0] != "order" {
		return nil
	}
	o, err := store.Get(ctx, k.Tenant(), parts[1])
	if errors.Is(err, orders.ErrNotFound) {
		return nil // The decision says what is wrong with the key.
	}
	if err != nil {
		return fmt.Errorf("load the order of %s: %w", k, err)
	}
	if err := o.CheckRunnable(); err != nil {
		return usagef("%v; its effects are not resolved", err)
	}
	return nil
}
