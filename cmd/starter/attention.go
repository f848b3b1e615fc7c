package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/pipeline"
)

func runAttention(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "attention", "[--json] [flags]",
		"Lists the order and refund runs that wait for an operator's decision: those whose outcome keyed\n"+
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
		runs, err := pipeline.ListAttention(ctx, tc)
		if err != nil {
			return err
		}
		if runs == nil {
			runs = []pipeline.Attention{}
		}
		if *asJSON {
			return writeJSON(e.stdout, runs)
		}
		if len(runs) == 0 {
			_, err := fmt.Fprintln(e.stdout, "no run waits for a decision")
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TENANT\tORDER\tWAITS ON\tSTARTED\tWORKFLOW ID\tTYPE")
		for _, r := range runs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", clean(r.TenantID), clean(r.OrderID), clean(r.Attention),
				r.StartTime.UTC().Format(time.RFC3339), clean(r.WorkflowID), clean(r.WorkflowType))
		}
		return tw.Flush()
	}, &tc)
}
