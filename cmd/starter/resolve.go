package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/keyedhq/keyed/effects"
)

func runResolve(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "resolve", "--key KEY --as done|retry --reason TEXT [flags]",
		"Settles an effect whose outcome keyed cannot know: an at-most-once receipt that failed as\n"+
			"\"ambiguous\", a terminal failure that a fix has made worth retrying, or a claim whose owner died.\n"+
			"Check the provider first (Stripe: metadata effect_key; SendGrid: custom_args effect_key), then:\n"+
			"  --as done   it happened: later runs replay --result and never act\n"+
			"  --as retry  it did not happen: the next run acts again\n"+
			"Then re-run the order's checkout with `starter start`: a failed run may run again, and every\n"+
			"step that already happened replays its stored outcome. Live claims and succeeded effects are refused.")
	key := f.String("key", "", "the effect `key`, such as acme:order:9f3a:receipt (required)")
	as := f.String("as", "", "`done` or `retry` (required)")
	reason := f.String("reason", "", "why, kept on the record (required)")
	result := f.String("result", "null", "with --as done: the outcome to store, as `JSON`, e.g. '{\"message_id\":\"…\"}'")
	asJSON := f.Bool("json", false, "print the record as JSON")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := requireFlags([][2]string{{"key", *key}, {"as", *as}, {"reason", *reason}}); err != nil {
		return err
	}
	k, err := effects.ParseKey(*key)
	if err != nil {
		return usagef("invalid --key: %v", err)
	}
	res := effects.Resolution(*as)
	if res != effects.ResolveDone && res != effects.ResolveRetry {
		return usagef("invalid --as %q: want done or retry", *as)
	}
	var outcome json.RawMessage
	if err := json.Unmarshal([]byte(*result), &outcome); err != nil {
		return usagef("invalid --result: not JSON: %v", err)
	}
	var fxc *effects.Client
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		rec, err := fxc.Resolve(ctx, k, effects.ResolveParams{Resolution: res, Result: outcome, Reason: *reason})
		if errors.Is(err, effects.ErrNotResolvable) || errors.Is(err, effects.ErrNotFound) {
			return usagef("%v", err)
		}
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(e.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rec)
		}
		_, err = fmt.Fprintf(e.stdout, "%s is now %s (%s)\n", rec.Key, rec.State, rec.ErrorMessage)
		return err
	}, &fxc)
}
