package doctor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/keyedhq/keyed/pipeline"
)

// searchAttributes checks that each of Opts.SearchAttributes is registered
// on the namespace with its type.
func (r *run) searchAttributes(ctx context.Context) []Check {
	resp, err := r.deps.Temporal.OperatorService().ListSearchAttributes(ctx,
		&operatorservice.ListSearchAttributesRequest{Namespace: r.o.Namespace})
	if err != nil {
		return []Check{errorCheck(CheckSearchAttributes, r.o.Namespace,
			fmt.Errorf("list search attributes of namespace %q: %w", r.o.Namespace, err), "check TEMPORAL_ADDRESS and TEMPORAL_NAMESPACE")}
	}
	have := resp.GetCustomAttributes()
	var out []Check
	for _, sa := range r.o.SearchAttributes {
		name, typ := sa.Name, sa.Type
		c := Check{Name: CheckSearchAttributes, Subject: name}
		fix := fmt.Sprintf("temporal operator search-attribute create --namespace %s --name %s --type %s", r.o.Namespace, name, typ)
		got, ok := have[name]
		switch {
		case !ok:
			c.Status = StatusFail
			c.Evidence = fmt.Sprintf("not registered on namespace %q: %s", r.o.Namespace, saConsequence(name))
			c.Fix = fix
		case !strings.EqualFold(typeName(got), typ):
			c.Status = StatusFail
			c.Evidence = fmt.Sprintf("registered on namespace %q as %s, not %s", r.o.Namespace, typeName(got), typ)
			c.Fix = "remove it (temporal operator search-attribute remove) and " + fix
		default:
			c.Status, c.Evidence = StatusPass, fmt.Sprintf("registered on namespace %q as %s", r.o.Namespace, typ)
		}
		out = append(out, c)
	}
	return out
}

// typeName turns INDEXED_VALUE_TYPE_KEYWORD into Keyword.
func typeName(t enumspb.IndexedValueType) string {
	s := strings.TrimPrefix(t.String(), "INDEXED_VALUE_TYPE_")
	if len(s) < 2 {
		return s
	}
	return s[:1] + strings.ToLower(s[1:])
}

func saConsequence(name string) string {
	if name == pipeline.SearchAttrAttentionName || name == pipeline.SearchAttrWaitingSinceName {
		return "a run that needs a decision cannot mark itself: its workflow task fails until the attribute is registered"
	}
	return "every start of a run that sets this attribute is refused"
}

// deadLetters reports the runs that wait for a decision or failed in the
// window not final, and the alert rules on them.
func (r *run) deadLetters(ctx context.Context) []Check {
	return []Check{r.deadRuns(ctx), r.deadAlerts()}
}

const replayPath = "list them with `starter attention`; decide a waiting run with `starter resolve --key … --as done|retry`; " +
	"for a failed run settle the effect with `starter resolve` and re-run it with `starter start --tenant … --order …`"

func (r *run) deadRuns(ctx context.Context) Check {
	const subject = "runs"
	waiting, err := pipeline.ListAttention(ctx, r.deps.Temporal)
	if err != nil {
		return errorCheck(CheckDeadLetters, subject, err, "register the KeyedAttention search attribute (see search_attributes)")
	}
	failed, final, err := r.failedRuns(ctx)
	if err != nil {
		return errorCheck(CheckDeadLetters, subject, err, "")
	}
	var parts []string
	if len(waiting) > 0 {
		oldest := waiting[0]
		for _, w := range waiting {
			if w.StartTime.Before(oldest.StartTime) {
				oldest = w
			}
		}
		parts = append(parts, fmt.Sprintf("%s for a decision, the oldest started %s ago (%s, %s)",
			pluralVerb(len(waiting), "run", "waits", "wait"), days(r.now.Sub(oldest.StartTime).Round(time.Minute)), oldest.WorkflowID, oldest.Attention))
	}
	if len(failed) > 0 {
		parts = append(parts, fmt.Sprintf("%s failed in the last %s, not final, the oldest %s ago (%s)",
			plural(len(failed), "run"), days(r.o.Window), days(r.now.Sub(failed[0].closed).Round(time.Minute)), failed[0].id))
	}
	finalNote := fmt.Sprintf("%s in the last %s ended final (a declined order, a refused refund: not a dead letter)", plural(final, "failed run"), days(r.o.Window))
	if len(parts) == 0 {
		return Check{Name: CheckDeadLetters, Subject: subject, Status: StatusPass,
			Evidence: "no run waits for a decision; " + finalNote + "; replay path: " + replayPath}
	}
	return Check{Name: CheckDeadLetters, Subject: subject, Status: StatusWarn,
		Evidence: strings.Join(parts, "; ") + "; " + finalNote, Fix: replayPath}
}

type failedRun struct {
	id     string
	closed time.Time
}

// failedRuns lists the runs of the pipelines that failed in the window,
// oldest first, leaving out those their pipeline calls final (a declined
// order, a refused refund), which it counts.
func (r *run) failedRuns(ctx context.Context) (out []failedRun, final int, err error) {
	q := fmt.Sprintf("(%s) AND ExecutionStatus = 'Failed' AND CloseTime >= '%s'",
		r.workflowTypes(), r.since().UTC().Format(time.RFC3339))
	specs := map[string]pipeline.Spec{}
	for _, s := range r.o.Pipelines {
		specs[s.Workflow] = s
	}
	var token []byte
	for {
		resp, err := r.deps.Temporal.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: q, NextPageToken: token})
		if err != nil {
			return nil, 0, fmt.Errorf("list failed runs (%s): %w", q, err)
		}
		for _, e := range resp.GetExecutions() {
			id := e.GetExecution().GetWorkflowId()
			if s, ok := specs[e.GetType().GetName()]; ok && s.Final != nil && s.Final(ctx, r.deps.Pool, id) {
				final++
				continue
			}
			out = append(out, failedRun{id: id, closed: e.GetCloseTime().AsTime()})
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			break
		}
	}
	slices.SortFunc(out, func(a, b failedRun) int { return a.closed.Compare(b.closed) })
	return out, final, nil
}

// pluralVerb renders "1 run waits", "2 runs wait".
func pluralVerb(n int, noun, one, many string) string {
	if n == 1 {
		return "1 " + noun + " " + one
	}
	return fmt.Sprintf("%d %ss %s", n, noun, many)
}

// providerRates reports each provider's bound on calls per second: the
// setting, and the rate Temporal enforces on its task queue (DescribeTaskQueue
// with its config), with the workers polling it. An unbounded provider
// passes with a hint; a bound no worker polls, or that the server does not
// enforce, warns.
func (r *run) providerRates(ctx context.Context) []Check {
	if len(r.o.ProviderRates) == 0 {
		return []Check{{Name: CheckProviderRate, Subject: "providers", Status: StatusPass,
			Evidence: "no provider bounds given: provider calls are not bounded across workers"}}
	}
	var out []Check
	for _, p := range r.o.ProviderRates {
		c := Check{Name: CheckProviderRate, Subject: p.Provider, Status: StatusPass}
		if p.PerSecond <= 0 {
			c.Evidence = fmt.Sprintf("%s=0: %s calls are not bounded across workers; a burst meets its 429s and retries", p.Setting, p.Provider)
			c.Fix = fmt.Sprintf("set %s on every worker below the provider's limit (see docs/deployment.md, \"Provider rate limits\")", p.Setting)
			out = append(out, c)
			continue
		}
		resp, err := r.deps.Temporal.WorkflowService().DescribeTaskQueue(ctx, &workflowservice.DescribeTaskQueueRequest{
			Namespace: r.o.Namespace, TaskQueue: &taskqueuepb.TaskQueue{Name: p.TaskQueue, Kind: enumspb.TASK_QUEUE_KIND_NORMAL},
			TaskQueueType: enumspb.TASK_QUEUE_TYPE_ACTIVITY, ReportConfig: true})
		if err != nil {
			out = append(out, errorCheck(CheckProviderRate, p.Provider, fmt.Errorf("describe task queue %s: %w", p.TaskQueue, err), ""))
			continue
		}
		eff := resp.GetEffectiveRateLimit()
		c.Evidence = fmt.Sprintf("%s=%g: %s steps run on task queue %s; Temporal enforces %g/s there (source %s), %d pollers",
			p.Setting, p.PerSecond, p.Provider, p.TaskQueue, eff.GetRequestsPerSecond(),
			eff.GetRateLimitSource().String(), len(resp.GetPollers()))
		switch {
		case len(resp.GetPollers()) == 0:
			c.Status, c.Fix = StatusWarn, "no worker polls "+p.TaskQueue+" yet: start a worker with "+p.Setting+" set"
		case eff.GetRateLimitSource() == enumspb.RATE_LIMIT_SOURCE_WORKER && float64(eff.GetRequestsPerSecond()) > p.PerSecond*1.01:
			c.Status, c.Fix = StatusWarn, "a worker polls with a higher limit: set "+p.Setting+" alike on every worker"
		}
		out = append(out, c)
	}
	return out
}
