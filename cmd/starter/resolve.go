package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
)

func runResolve(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "resolve", "--key KEY --as done|retry --reason TEXT [--result JSON] [--json] [flags]",
		"Settles an effect whose outcome keyed cannot know: an at-most-once receipt that failed as\n"+
			"\"ambiguous\", a terminal failure that a fix has made worth retrying, or a claim whose owner died.\n"+
			"Check the provider first (Stripe: metadata effect_key; SendGrid: custom_args effect_key), then:\n"+
			"  --as done   it happened: later runs replay --result and never act\n"+
			"  --as retry  it did not happen: the next run acts again\n"+
			"Then re-run the order's checkout with 'starter start': a failed run may run again, and every\n"+
			"step that already happened replays its stored outcome. Live claims and succeeded effects are refused,\n"+
			"and so is every effect of a failed order (a declined charge): a failed order is final.\n"+
			"The reason is refused, not stored, when it holds a control or invisible character (newlines too).\n"+
			"When the run of the key's order or refund waits for this decision (KeyedAttention, see\n"+
			"'starter attention'), resolve sends it the decide update instead: the run applies it, fenced and\n"+
			"audited with --by, and continues in the same run, so no 'starter start' is needed. Otherwise it\n"+
			"settles the record alone.",
		config.MigrateFlag)
	key := f.String("key", "", "the effect `key`, such as acme:order:9f3a:receipt (required)")
	as := f.String("as", "", "the `outcome`: done (it happened) or retry (it did not) (required)")
	reason := f.String("reason", "", fmt.Sprintf("why, kept on the record: one line of printable `text`, at most %d bytes (required)", maxReasonBytes))
	result := f.String("result", "", fmt.Sprintf("with --as done only: the outcome to store, as `JSON` of at most %d bytes,\n"+
		"such as '{\"message_id\":\"…\"}' (default null)", effects.MaxResultBytes))
	asJSON := f.Bool("json", false, "print the record (or the decision) as JSON")
	by := f.String("by", "", "who decides, kept with a decision sent to a waiting run (default $USER)")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := requireFlags([][2]string{{"key", *key}, {"as", *as}, {"reason", *reason}}); err != nil {
		return err
	}
	params, err := resolveParams(*as, *reason, *result, f.isSet("result"))
	if err != nil {
		return err
	}
	k, err := effects.ParseKey(*key)
	if err != nil {
		return usagef("invalid --key: %v", err)
	}
	if *by == "" {
		*by, _ = e.lookup("USER")
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
		decided, err := decideWaitingRun(ctx, e, tc, k, params, *by)
		if err != nil || decided != nil {
			return printDecision(e, decided, err, *asJSON)
		}
		rec, err := fxc.Resolve(ctx, k, params)
		if errors.Is(err, effects.ErrNotResolvable) || errors.Is(err, effects.ErrNotFound) {
			return usagef("%v", err)
		}
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

// decideWaitingRun sends the decision to the run that makes k's effect,
// an order's or a refund's (runOfKey), when it waits on k's step, and
// returns what the run applied. It returns nil and no error when no run
// waits (or Temporal cannot be asked, which it reports on stderr), so that
// the caller settles the record alone; and a usage error when the run
// waits on another step or refuses the decision.
func decideWaitingRun(ctx context.Context, e *env, tc client.Client, k effects.Key, p effects.ResolveParams, by string) (*pipeline.DecisionResult, error) {
	id, keyStep, ok := runOfKey(k)
	if !ok {
		return nil, nil
	}
	askCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	waits, runID, err := pipeline.AttentionOf(askCtx, tc, id)
	var notFound *serviceerror.NotFound
	switch {
	case errors.Is(err, pipeline.ErrNotWaiting), errors.As(err, &notFound):
		return nil, nil
	case err != nil:
		fmt.Fprintf(e.stderr, "starter resolve: cannot ask Temporal whether the run %s waits (%v); settling the record only\n", id, err)
		return nil, nil
	}
	step, _, _ := strings.Cut(waits, ":")
	if step != keyStep {
		return nil, usagef("the run %s waits on %s (%s), not on %s: decide that step", id, step, waits, keyStep)
	}
	d := pipeline.Decision{Step: step, Resolution: p.Resolution, Reason: p.Reason, By: by}
	if raw, ok := p.Result.(json.RawMessage); ok {
		d.Result = raw
	}
	res, err := pipeline.SendDecision(ctx, tc, id, runID, d)
	if err != nil {
		return nil, usagef("the waiting run refused the decision: %v", err)
	}
	return res, nil
}

// runOfKey returns the workflow ID of the run whose step makes the effect
// k, and that step, as the pipeline that owns k's shape derives it: an
// order's (orders.WorkflowIDOfKey) or a refund's
// (refunds.WorkflowIDOfKey). ok is false for any other key.
func runOfKey(k effects.Key) (id, step string, ok bool) {
	if id, step, ok := orders.WorkflowIDOfKey(k); ok {
		return id, step, true
	}
	return refunds.WorkflowIDOfKey(k)
}

// printDecision prints a decision the waiting run applied, or err.
func printDecision(e *env, d *pipeline.DecisionResult, err error, asJSON bool) error {
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, d)
	}
	_, err = fmt.Fprintf(e.stdout, "%s decided %s in the waiting run: the record is now %s (generation %d) and the run continues\n",
		clean(d.EffectKey), d.Resolution, d.State, d.Generation)
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
		return nil // Resolve says what is wrong with the key.
	}
	if err != nil {
		return fmt.Errorf("load the order of %s: %w", k, err)
	}
	if err := o.CheckRunnable(); err != nil {
		return usagef("%v; its effects are not resolved", err)
	}
	return nil
}

// maxReasonBytes is the longest --reason effects.Resolve stores.
const maxReasonBytes = effects.MaxReasonBytes

// resolveParams checks resolve's --as, --reason and --result (resultSet
// when --result was given) and returns Resolve's parameters, or a usage
// error that says what is wrong.
func resolveParams(as, reason, result string, resultSet bool) (effects.ResolveParams, error) {
	p := effects.ResolveParams{Resolution: effects.Resolution(as), Reason: strings.TrimSpace(reason)}
	switch p.Resolution {
	case effects.ResolveDone:
	case effects.ResolveRetry:
		if resultSet {
			return p, usagef("--result goes with --as done only: a retried effect stores no outcome")
		}
	default:
		return p, usagef("invalid --as %q: want done or retry", as)
	}
	if n := len(p.Reason); n > maxReasonBytes {
		return p, usagef("invalid --reason: %d bytes, over the %d kept on the record", n, maxReasonBytes)
	}
	for i, r := range p.Reason {
		if r == utf8.RuneError || !printable(r) {
			return p, usagef("invalid --reason: %s at byte %d is a control or invisible character; give one line of printable text",
				strconv.QuoteRune(r), i)
		}
	}
	if !resultSet {
		return p, nil
	}
	var outcome bytes.Buffer
	if err := json.Compact(&outcome, []byte(result)); err != nil {
		return p, usagef("invalid --result: not JSON: %v", err)
	}
	if n := outcome.Len(); n > effects.MaxResultBytes {
		return p, usagef("invalid --result: %d bytes of JSON, over the %d an outcome may have", n, effects.MaxResultBytes)
	}
	p.Result = json.RawMessage(outcome.Bytes())
	return p, nil
}
