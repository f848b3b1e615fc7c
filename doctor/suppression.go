package doctor

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/keyedhq/keyed/slotshare"
)

// suppressedMetric counts claims that found their effect already done.
const suppressedMetric = "keyed_effect_duplicates_suppressed_total"

// suppression compares, per keyed activity, Temporal's retries in recent
// histories with the retries the effect guard saw and the duplicates it
// suppressed. Retries with neither warn: the activity may not claim its key.
func (r *run) suppression(ctx context.Context) []Check {
	retries, runs, err := r.temporalRetries(ctx)
	if err != nil {
		return []Check{errorCheck(CheckSuppression, "deployment", err, "")}
	}
	guarded, err := r.guardedRetries(ctx)
	if err != nil {
		return []Check{errorCheck(CheckSuppression, "deployment", err, "")}
	}
	suppressed, source, err := r.suppressed(ctx)
	var out []Check
	if err != nil {
		// The operator asked for these metrics: not reading them is no pass.
		source = "not read: " + err.Error()
		out = append(out, errorCheck(CheckSuppression, "metrics", err,
			"point --metrics-url at a running worker's /metrics (its METRICS_ADDR)"))
	}
	for _, a := range r.o.Activities {
		if a.KeyShape == "" {
			continue
		}
		n, g, s := retries[a.Name], guarded[a.Step], suppressed[a.Step]
		c := Check{Name: CheckSuppression, Subject: a.Name, Status: StatusPass}
		seen := fmt.Sprintf("%s claimed again (last %s); suppressed %s", plural(g, a.Step+" record"), days(r.o.Window), suppressedText(s, source))
		switch {
		case n == 0:
			c.Evidence = fmt.Sprintf("Temporal retried no %s attempt in %s; %s", a.Name, plural(runs, "recent run"), seen)
		case g+s == 0:
			c.Status = StatusWarn
			c.Evidence = fmt.Sprintf("Temporal retried %s %s in %s, yet the guard saw none of it: %s; "+
				"the activity may act without claiming its effect key", a.Name, plural(n, "time"), plural(runs, "recent run"), seen)
			c.Fix = fmt.Sprintf("make %s claim %s through effects.Do or Claim before it acts, and export the effects metrics", a.Name, a.KeyShape)
		default:
			c.Evidence = fmt.Sprintf("Temporal retried %s %s in %s; the guard saw them: %s", a.Name, plural(n, "time"), plural(runs, "recent run"), seen)
		}
		out = append(out, c)
	}
	return out
}

func suppressedText(n int, source string) string {
	switch {
	case source == "":
		return "duplicates not read (no metrics given: pass --metrics-url)"
	case strings.HasPrefix(source, "not read: "):
		return "duplicates " + source
	}
	return fmt.Sprintf("%s (%s)", plural(n, "duplicate"), source)
}

// temporalRetries reads the histories of up to HistorySample runs of the
// activities' workflows (Activity.Workflow) started in the window and
// sums, per activity type, the attempts after the first.
func (r *run) temporalRetries(ctx context.Context) (map[string]int, int, error) {
	q := fmt.Sprintf("(%s) AND StartTime >= '%s'", r.workflowTypes(), r.since().UTC().Format(time.RFC3339))
	retries := map[string]int{}
	runs := 0
	var token []byte
	for runs < r.o.HistorySample {
		resp, err := r.deps.Temporal.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Query: q, NextPageToken: token, PageSize: int32(min(r.o.HistorySample, 100))})
		if err != nil {
			return nil, 0, fmt.Errorf("list recent runs (%s): %w", q, err)
		}
		for _, e := range resp.GetExecutions() {
			if runs >= r.o.HistorySample {
				break
			}
			if err := r.countRetries(ctx, e.GetExecution().GetWorkflowId(), e.GetExecution().GetRunId(), retries); err != nil {
				return nil, 0, err
			}
			runs++
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			break
		}
	}
	return retries, runs, nil
}

// workflowTypes returns the visibility query that matches the runs of the
// pipelines: "WorkflowType = 'OrderWorkflow' OR …".
func (r *run) workflowTypes() string {
	terms := make([]string, 0, len(r.o.Pipelines))
	for _, s := range r.o.Pipelines {
		terms = append(terms, fmt.Sprintf("WorkflowType = '%s'", s.Workflow))
	}
	if len(terms) == 0 {
		return "WorkflowType = ''"
	}
	return strings.Join(terms, " OR ")
}

func (r *run) countRetries(ctx context.Context, id, runID string, retries map[string]int) error {
	it := r.deps.Temporal.GetWorkflowHistory(ctx, id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	scheduled := map[int64]string{}
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return fmt.Errorf("read the history of %s: %w", id, err)
		}
		if a := ev.GetActivityTaskScheduledEventAttributes(); a != nil {
			scheduled[ev.GetEventId()] = a.GetActivityType().GetName()
		}
		a := ev.GetActivityTaskStartedEventAttributes()
		// An attempt after one the worker refused over its tenant's share
		// (slotshare) follows attempts that never ran the activity, so its
		// retries need not show in the guard: not counted.
		if a != nil && a.GetAttempt() > 1 && a.GetLastFailure().GetApplicationFailureInfo().GetType() != slotshare.ErrorType {
			retries[scheduled[a.GetScheduledEventId()]] += int(a.GetAttempt() - 1)
		}
	}
	return nil
}

// guardedRetries counts, per kind, the records created in the window that
// were claimed more than once: a retry that re-entered its claim or took
// it over.
func (r *run) guardedRetries(ctx context.Context) (map[string]int, error) {
	rows, err := r.deps.Pool.Query(ctx, `SELECT kind, count(*) FROM keyed_effects
WHERE created_at >= $1 AND attempts > 1 GROUP BY kind`, r.since())
	if err != nil {
		return nil, fmt.Errorf("count records claimed again: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var kind string
		var n int
		if err := rows.Scan(&kind, &n); err != nil {
			return nil, fmt.Errorf("count records claimed again: %w", err)
		}
		out[kind] = n
	}
	return out, rows.Err()
}

// suppressed reads keyed_effect_duplicates_suppressed_total by kind from
// Opts.Gatherer or Opts.MetricsURL, and says where from; "" when neither
// is given. It returns the error of the read.
func (r *run) suppressed(ctx context.Context) (map[string]int, string, error) {
	var families []*dto.MetricFamily
	var source string
	switch {
	case r.o.Gatherer != nil:
		fams, err := r.o.Gatherer.Gather()
		if err != nil {
			return nil, "", fmt.Errorf("gather metrics: %w", err)
		}
		families, source = fams, "this worker's counter since it started"
	case r.o.MetricsURL != "":
		fams, err := scrape(ctx, r.o.MetricsURL)
		if err != nil {
			return nil, "", err
		}
		families, source = fams, r.o.MetricsURL+" since that worker started"
	default:
		return nil, "", nil
	}
	out := map[string]int{}
	for _, f := range families {
		if f.GetName() != suppressedMetric {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" {
					out[l.GetValue()] += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out, source, nil
}

// scrape reads a Prometheus text exposition from url.
func scrape(ctx context.Context, url string) ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for name, f := range fams {
		if strings.HasPrefix(name, "keyed_") {
			out = append(out, f)
		}
	}
	return out, nil
}
