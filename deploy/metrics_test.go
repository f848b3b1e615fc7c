package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/reconcile"
	"github.com/keyedhq/keyed/step"
)

const dashboardFile = "grafana/keyed.json"

// TestMetricNamesExist checks that every metric the alert rules, their
// unit tests and the Grafana dashboard name is one keyed exports. The
// names come from the real worker's /metrics after an order ran through it
// (the Temporal SDK's, Go's and the process's metrics appear only once
// used) and from the collectors keyed's metric constructors register (so
// that a counter no run happened to touch still counts).
func TestMetricNamesExist(t *testing.T) {
	t.Parallel()
	exported := scrapeAfterRun(t)
	for name := range describedNames(t) {
		exported[name] = true
	}

	used := map[string][]string{} // metric name -> where
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			for _, n := range promqlMetricNames(r.Expr) {
				used[n] = append(used[n], "rule "+r.Alert)
			}
		}
	}
	for _, s := range ruleTestSeries(t) {
		n, _, _ := strings.Cut(s, "{")
		used[n] = append(used[n], "rule test series "+s)
	}
	queries := dashboardQueries(t)
	require.NotEmpty(t, queries)
	for where, q := range queries {
		names := promqlMetricNames(q)
		require.NotEmpty(t, names, "%s: %q names no metric", where, q)
		for _, n := range names {
			used[n] = append(used[n], where)
		}
	}
	var missing []string
	for n, where := range used {
		if !exported[n] {
			missing = append(missing, fmt.Sprintf("%s (in %s)", n, strings.Join(where, "; ")))
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing, "metrics keyed does not export; it exports:\n%s", strings.Join(sortedKeys(exported), "\n"))
}

// scrapeAfterRun starts the worker app as cmd/worker wires it, runs one
// order through the outbox, the workflow (with two failed charge
// attempts, one of them in the workflow task) and both providers, makes one Temporal request fail, and
// returns the sample names its /metrics serves.
func scrapeAfterRun(t *testing.T) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := fxapptest.Start(t, nil)
	// The first two charge attempts fail (Stripe answers 500): the first,
	// in the workflow task, and the activity's first, which is retried, so
	// the SDK's local activity and activity failure metrics appear too.
	w.Stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultServerError, Times: 2})

	tx, err := w.Pool.Begin(ctx)
	require.NoError(t, err)
	_, _, err = w.Orders.CreateAndEnqueueTx(ctx, tx, orders.NewOrder{TenantID: "acme", ID: "metrics-1", AmountMinor: 1999,
		Currency: "usd", CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa"})
	if err != nil {
		_ = tx.Rollback(ctx)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	run := w.Client.GetWorkflow(ctx, orders.WorkflowID("acme", "metrics-1"), "")
	require.Eventually(t, func() bool {
		_, err := w.Client.DescribeWorkflow(ctx, orders.WorkflowID("acme", "metrics-1"), "")
		return err == nil
	}, time.Minute, 50*time.Millisecond, "the relay starts the order's workflow")
	require.NoError(t, run.Get(ctx, nil), "the order's workflow completes")
	require.Equal(t, 1, w.Stripe.Charges(), "one charge reached the Stripe fake")
	// And one Temporal request fails, for the SDK's request failure metrics.
	_, err = w.Client.DescribeWorkflow(ctx, "no-such-workflow", "")
	require.Error(t, err)

	resp, err := http.Get("http://" + w.Metrics.Addr() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	names := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		n := line[:strings.IndexAny(line, "{ ")]
		names[n] = true
	}
	for _, want := range []string{"keyed_effect_claims_acquired_total", "keyed_outbox_starts_total", "temporal_request_total",
		"temporal_activity_execution_failed_total", "temporal_local_activity_execution_failed_total", "temporal_request_failure_total", "go_goroutines"} {
		require.True(t, names[want], "the worker's /metrics has %s after a run:\n%s", want, body)
	}
	return names
}

// describedNames returns the sample names of every collector keyed's
// metric constructors register (those fxapp calls), touched or not.
func describedNames(t *testing.T) map[string]bool {
	t.Helper()
	d := &describer{names: map[string]bool{}}
	_, err := effects.NewMetrics(d)
	require.NoError(t, err)
	_, err = outbox.NewMetrics(d)
	require.NoError(t, err)
	_, err = api.NewMetrics(d)
	require.NoError(t, err)
	_, err = doctor.NewMetrics(d)
	require.NoError(t, err)
	// reconcile registers its collectors in New; the clients are not used.
	fxc, err := effects.NewClient(dummyDB{}, nil)
	require.NoError(t, err)
	sc, err := stripestep.NewClient("sk_test_describe", "http://127.0.0.1:1", nil)
	require.NoError(t, err)
	_, err = reconcile.New(fxc, dummyDB{}, sc, &reconcile.Opts{Registerer: d})
	require.NoError(t, err)
	// The order workflow counts decision waits and timeouts through the
	// Temporal SDK's metrics handler, which fxapp exports as <name>_total
	// (as the scrape shows for the SDK's own counters, such as
	// temporal_request_total); no run here waits for a decision.
	for _, name := range []string{pipeline.MetricAttentionWaits, pipeline.MetricDecisionTimeouts, pipeline.MetricDecisions, step.MetricUniqueViolations} {
		d.names[name+"_total"] = true
	}
	for _, want := range []string{"keyed_effect_takeovers_total", "keyed_outbox_depth", "keyed_api_requests_total", "keyed_reconcile_findings"} {
		require.True(t, d.names[want], "%s is described", want)
	}
	return d.names
}

// describer is a prometheus.Registerer that records the sample names of
// the collectors registered with it.
type describer struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describer) Register(c prometheus.Collector) error {
	suffixes := []string{""}
	switch c.(type) {
	case *prometheus.HistogramVec, prometheus.Histogram:
		suffixes = []string{"_bucket", "_sum", "_count"}
	// A lone prometheus.Summary has Histogram's method set, so the case
	// above would take it; keyed registers none.
	case *prometheus.SummaryVec:
		suffixes = []string{"", "_sum", "_count"}
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for desc := range ch {
		m := fqName.FindStringSubmatch(desc.String())
		if m == nil {
			return fmt.Errorf("no fqName in %s", desc)
		}
		for _, s := range suffixes {
			d.names[m[1]+s] = true
		}
	}
	return nil
}

func (d *describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := d.Register(c); err != nil {
			panic(err)
		}
	}
}

func (d *describer) Unregister(prometheus.Collector) bool { return false }

// dummyDB satisfies effects.DB for constructors that only keep it.
type dummyDB struct{ effects.DB }

// ruleTestSeries returns the input series of the rules' unit tests.
func ruleTestSeries(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(rulesTestFile)
	require.NoError(t, err)
	var f struct {
		Tests []struct {
			InputSeries []struct {
				Series string `json:"series"`
			} `json:"input_series"`
		} `json:"tests"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &f))
	var out []string
	for _, tc := range f.Tests {
		for _, s := range tc.InputSeries {
			out = append(out, s.Series)
		}
	}
	require.NotEmpty(t, out)
	return out
}

// dashboardQueries returns every PromQL query of the dashboard (panel
// targets and template variables), by where it is.
func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
			Panels []json.RawMessage `json:"panels"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	out := map[string]string{}
	for _, p := range d.Panels {
		require.Empty(t, p.Panels, "panel %q: keep rows expanded so every panel is checked", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q target %s", p.Title, tg.RefID)
			out[fmt.Sprintf("dashboard panel %q %s", p.Title, tg.RefID)] = tg.Expr
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		require.NoError(t, json.Unmarshal(v.Query, &q))
		out["dashboard variable "+v.Name] = labelValuesSelector(q.Query)
	}
	return out
}

// labelValuesSelector returns the series selector of a Grafana
// label_values(selector, label) query, or q itself.
func labelValuesSelector(q string) string {
	inner, ok := strings.CutPrefix(strings.TrimSpace(q), "label_values(")
	if !ok {
		return q
	}
	inner = strings.TrimSuffix(inner, ")")
	if i := strings.LastIndex(inner, ","); i >= 0 {
		inner = inner[:i]
	}
	return inner
}

var (
	promqlStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlBraces   = regexp.MustCompile(`\{[^{}]*\}`)
	promqlRanges   = regexp.MustCompile(`\[[^\[\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promqlIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promqlKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true,
		"start": true, "end": true}
)

// promqlMetricNames returns the metric names a PromQL query (or a
// Grafana label_values query) selects: identifiers outside strings, label
// matchers, ranges and grouping clauses that are not functions, keywords
// or parts of numbers and durations.
func promqlMetricNames(q string) []string {
	q = promqlStrings.ReplaceAllString(q, `""`)
	q = promqlBraces.ReplaceAllString(q, " ")
	q = promqlRanges.ReplaceAllString(q, " ")
	q = promqlGrouping.ReplaceAllString(q, " ")
	var names []string
	for _, loc := range promqlIdent.FindAllStringIndex(q, -1) {
		word := q[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsAny(q[loc[0]-1:loc[0]], "0123456789.$") {
			continue // 1e-9, 5m, $variable
		}
		if rest := strings.TrimLeft(q[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function or an aggregation
		}
		if promqlKeywords[strings.ToLower(word)] {
			continue
		}
		names = append(names, word)
	}
	return names
}

// TestPromQLMetricNames pins the name extraction the check relies on.
func TestPromQLMetricNames(t *testing.T) {
	t.Parallel()
	for q, want := range map[string][]string{
		`sum by (kind) (rate(keyed_effect_takeovers_total{kind="charge",x=~"a|b"}[5m])) > 0`:                         {"keyed_effect_takeovers_total"},
		`histogram_quantile(0.99, sum by (le) (rate(keyed_effect_claim_duration_seconds_bucket[$__rate_interval])))`: {"keyed_effect_claim_duration_seconds_bucket"},
		`a_total / on (job) group_left (instance) b_total offset 1h and c unless d > bool 1e-9`:                      {"a_total", "b_total", "c", "d"},
		`time() - max(keyed_reconcile_last_success_timestamp_seconds{job=~"$job"})`:                                  {"keyed_reconcile_last_success_timestamp_seconds"},
		`max(keyd_outbox_depth)`: {"keyd_outbox_depth"},
	} {
		require.Equal(t, want, promqlMetricNames(q), q)
	}
	require.Equal(t, []string{"keyed_outbox_depth"}, promqlMetricNames(labelValuesSelector(`label_values(keyed_outbox_depth{job="w"}, job)`)))
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
