package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

func runAttention(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "attention", "[--json] [flags]",
		"Lists the runs of every pipeline that wait for an operator's decision: those whose outcome keyed\n"+
			"cannot know (an ambiguous receipt or refund email, a reused key, retries that ran out). It is the Web UI's query\n"+
			"'"+pipeline.AttentionQuery+"'. Decide one with 'starter resolve --key KEY --as done|retry'\n"+
			"or the run's decide update in the Web UI.",
		config.MigrateFlag)
	asJSON := f.Bool("json", false, "print the runs as JSON")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	var tc client.Client
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		runs, err := pipeline.ListAttention(ctx, tc, keywords()...)
		if err != nil {
			return err
		}
		if runs == nil {
			runs = []pipeline.Attention{}
		}
		for i := range runs {
			askCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := runs[i].ReadWait(askCtx, tc); err != nil {
				fmt.Fprintf(e.stderr, "starter attention: cannot ask %s for its wait: %v\n", clean(runs[i].WorkflowID), err)
			}
			cancel()
		}
		if *asJSON {
			return writeJSON(e.stdout, runs)
		}
		if len(runs) == 0 {
			_, err := fmt.Fprintln(e.stdout, "no run waits for a decision")
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TENANT\tSEARCH ATTRIBUTES\tWAITS ON\tWAITING SINCE\tWAITED\tWORKFLOW ID\tTYPE")
		now := time.Now()
		for _, r := range runs {
			since, waited := "-", "-"
			if !r.WaitingSince.IsZero() {
				since, waited = r.WaitingSince.UTC().Format(time.RFC3339), now.Sub(r.WaitingSince).Round(time.Second).String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", clean(r.TenantID), clean(pairs(r.Keywords)), clean(r.Attention),
				since, waited, clean(r.WorkflowID), clean(r.WorkflowType))
		}
		return tw.Flush()
	}, &tc)
}

// keywords names the Keyword search attributes the pipelines' runs set
// besides the framework's, for the attention list.
func keywords() []string {
	var out []string
	for _, s := range workflows.Pipelines() {
		for _, sa := range s.SearchAttributes {
			if sa.Type == "Keyword" && !slices.Contains(out, sa.Name) {
				out = append(out, sa.Name)
			}
		}
	}
	return out
}

// pairs renders keywords as "Name=value" pairs, sorted by name, or "-".
func pairs(keywords map[string]string) string {
	if len(keywords) == 0 {
		return "-"
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(keywords)) {
		out = append(out, name+"="+keywords[name])
	}
	return strings.Join(out, " ")
}
