package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

// maxRate bounds resolve --rate: a ticker needs a positive interval, and
// a batch faster than this would only flood Temporal with updates.
const maxRate = 1000

// batch holds resolve's flags for deciding the runs a query lists.
type batch struct {
	query  *string
	step   *string
	dryRun *bool
	rate   *float64
}

func batchFlags(f *flags) batch {
	return batch{
		query: f.String("query", "", "decide every waiting run this visibility `query` lists, such as \"KeyedAttention = 'receipt:ambiguous'\"\n"+
			"(AND-ed with "+pipeline.AttentionQuery+"); a done takes each run's outcome from its provider"),
		step:   f.String("step", "", "with --query: decide only the runs waiting on this `step`; required when the query lists several"),
		dryRun: f.Bool("dry-run", false, "with --query: list each run, the provider's evidence and what would be decided; decide nothing"),
		rate:   f.Float64("rate", 5, "with --query: at most this many decisions a `second`"),
	}
}

// runResolveQuery decides, as d says, every waiting run that b's query
// lists, at most b.rate a second: a retry as given, a done with the
// outcome the step's provider shows (a run without one is skipped and
// listed). It refuses a query that lists runs waiting on several steps
// without --step. With --dry-run it only lists the runs and the evidence.
func runResolveQuery(ctx context.Context, e *env, f *flags, cfg *config.Config, b batch, d pipeline.Decision, asJSON bool) error {
	if err := checkBatch(b, d); err != nil {
		return err
	}
	var (
		pool *pgxpool.Pool
		fxc  *effects.Client
		tc   client.Client
	)
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		waits, err := pipeline.ListWaits(ctx, tc, *b.query)
		var invalid *serviceerror.InvalidArgument
		switch {
		case errors.As(err, &invalid):
			return usagef("list the runs of --query: %s", failureMessage(err))
		case err != nil: // Temporal down: nothing was decided, retry
			return fmt.Errorf("list the runs of --query: %w", err)
		}
		if waits, err = oneStep(waits, *b.step); err != nil {
			return err
		}
		deps, err := providerDeps(cfg, pool, fxc)
		if err != nil {
			return err
		}
		defs, err := pipeline.Definitions(workflows.Pipelines(), deps)
		if err != nil {
			return err
		}
		settler, err := pipeline.NewSettler(tc, defs, nil)
		if err != nil {
			return err
		}
		verdicts := decideAll(ctx, tc, settler, waits, d, b)
		return printVerdicts(e, verdicts, *b.dryRun, asJSON)
	}, &pool, &fxc, &tc)
}

// checkBatch returns a usage error naming every problem of a batch
// decision at once.
func checkBatch(b batch, d pipeline.Decision) error {
	var problems []string
	if r := *b.rate; !(r > 0 && r <= maxRate) { // NaN fails both
		problems = append(problems, fmt.Sprintf("--rate must be above 0 and at most %d decisions a second", maxRate))
	}
	d.Step = "any"
	var invalid *pipeline.DecisionError
	if errors.As(pipeline.CheckDecision(d, d.Step, nil), &invalid) {
		for _, p := range invalid.Problems {
			if p.Field != "result" { // A done takes each run's outcome from its provider.
				problems = append(problems, flagProblem(p, d))
			}
		}
	}
	if problems != nil {
		return usagef("%s", strings.Join(problems, "; "))
	}
	return nil
}

// oneStep returns the waits on step, or all of them when they wait on one
// step and step is empty; a usage error otherwise.
func oneStep(waits []*pipeline.Wait, step string) ([]*pipeline.Wait, error) {
	var steps []string
	var out []*pipeline.Wait
	for _, w := range waits {
		if !slices.Contains(steps, w.Step) {
			steps = append(steps, w.Step)
		}
		if step == "" || w.Step == step {
			out = append(out, w)
		}
	}
	if step == "" && len(steps) > 1 {
		slices.Sort(steps)
		return nil, usagef("--query lists runs waiting on %d steps (%s): give --step, one decision per kind of step",
			len(steps), strings.Join(steps, ", "))
	}
	return out, nil
}

// decideAll examines each wait and, unless b.dryRun, sends d to it, at
// most b.rate a second: a done with the outcome the provider shows.
func decideAll(ctx context.Context, tc client.Client, s *pipeline.Settler, waits []*pipeline.Wait, d pipeline.Decision, b batch) []pipeline.Verdict {
	tick := time.NewTicker(time.Duration(float64(time.Second) / *b.rate))
	defer tick.Stop()
	out := make([]pipeline.Verdict, 0, len(waits))
	for i, w := range waits {
		v := s.Examine(ctx, w)
		wd := d
		wd.Step, wd.Wait, wd.Result = w.Step, w.Wait, nil
		switch {
		case d.Resolution == effects.ResolveDone && v.Result == nil:
			v.Resolution, v.Error = "", "no outcome found at the provider: decide it alone with --key and --result"
			out = append(out, v)
			continue
		case d.Resolution == effects.ResolveDone:
			wd.Result = v.Result
		}
		v.Resolution = d.Resolution
		if !*b.dryRun {
			if i > 0 {
				<-tick.C
			}
			if _, err := pipeline.SendDecision(ctx, tc, w.WorkflowID, w.RunID, wd); err != nil {
				v.Error = failureMessage(err)
			} else {
				v.Applied = true
			}
		}
		out = append(out, v)
	}
	return out
}

// printVerdicts prints one line per run: its wait, the decision, whether
// it was applied and the evidence; or the verdicts as JSON.
func printVerdicts(e *env, verdicts []pipeline.Verdict, dryRun, asJSON bool) error {
	if asJSON {
		return writeJSON(e.stdout, verdicts)
	}
	if len(verdicts) == 0 {
		_, err := fmt.Fprintln(e.stdout, "no run the query lists waits for a decision")
		return err
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WAIT\tWAITING SINCE\tDECISION\tOUTCOME\tEVIDENCE")
	failed := 0
	for _, v := range verdicts {
		outcome := "would decide"
		switch {
		case v.Error != "" && dryRun:
			outcome = "would not decide: " + v.Error
		case v.Error != "":
			outcome, failed = "not decided: "+v.Error, failed+1
		case v.Applied:
			outcome = "decided"
		case !dryRun:
			outcome = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", clean(v.Wait.Wait), v.WaitingSince.UTC().Format(time.RFC3339),
			orDash(string(v.Resolution)), clean(outcome), clean(v.Evidence))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed > 0 {
		return usagef("%d of %d runs were not decided", failed, len(verdicts))
	}
	return nil
}

// orDash returns s, or "-" when it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
