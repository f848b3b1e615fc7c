// Package doctor checks a live keyed deployment against the hardening
// checklist every job that touches money or an inbox should meet, and reports
// each check as pass, warn, fail or error with its evidence and its fix. Run
// connects through Deps and runs the checks named in Opts.Checks, all by
// default; Report.ExitCode maps the worst status to an exit code. It imports
// no fx: cmd/starter and internal/fxapp wire it. What each check compares is
// listed in docs/design.md ("Notes moved from the code", doctor).
package doctor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

// Status is a check's verdict.
type Status string

// The verdicts, from best to worst for the exit code (see Report.ExitCode).
const (
	StatusPass Status = "pass"
	StatusWarn Status = "warn"
	// StatusError means the check could not be made.
	StatusError Status = "error"
	StatusFail  Status = "fail"
)

// Exit codes of a doctor run (Report.ExitCode).
const (
	ExitPass     = 0
	ExitError    = 1
	ExitWarnings = 3
	ExitFailures = 4
)

// The checks' names.
const (
	CheckClassified       = "classified"
	CheckTimeouts         = "timeouts"
	CheckLease            = "lease"
	CheckRetention        = "retention"
	CheckSearchAttributes = "search_attributes"
	CheckPool             = "pool"
	CheckDeadLetters      = "dead_letters"
	CheckSuppression      = "suppression"
	CheckReconcile        = "reconcile"
	CheckPartitions       = "partitions"
	CheckProviderRate     = "provider_rate"
	CheckMigrations       = "migrations"
)

// AllChecks lists every check in report order.
var AllChecks = []string{CheckMigrations, CheckClassified, CheckTimeouts, CheckLease, CheckRetention, CheckSearchAttributes,
	CheckPool, CheckDeadLetters, CheckSuppression, CheckReconcile, CheckProviderRate, CheckPartitions}

// CheapChecks are the checks a worker runs at start and then hourly: a few
// small queries and calls (the timeouts' one reads the window's effect
// records by kind), no scans of history or visibility.
var CheapChecks = []string{CheckMigrations, CheckClassified, CheckTimeouts, CheckLease, CheckRetention, CheckSearchAttributes, CheckPool, CheckReconcile, CheckPartitions}

// Check is one verdict about one subject: an activity, a setting, a search
// attribute, or the deployment.
type Check struct {
	Name     string `json:"check"`
	Subject  string `json:"subject"`
	Status   Status `json:"status"`
	Evidence string `json:"evidence"`
	Fix      string `json:"fix,omitempty"`
}

// Report is the result of Run.
type Report struct {
	Namespace string    `json:"namespace"`
	At        time.Time `json:"at"`
	Checks    []Check   `json:"checks"`
	Exit      int       `json:"exit_code"`
}

// ExitCode returns 4 when a check failed, else 1 when one could not be
// made, else 3 when one warned, else 0.
func (r *Report) ExitCode() int {
	has := func(s Status) bool {
		return slices.ContainsFunc(r.Checks, func(c Check) bool { return c.Status == s })
	}
	switch {
	case has(StatusFail):
		return ExitFailures
	case has(StatusError):
		return ExitError
	case has(StatusWarn):
		return ExitWarnings
	}
	return ExitPass
}

// Find returns the checks named name about subject ("" for any subject).
func (r *Report) Find(name, subject string) []Check {
	var out []Check
	for _, c := range r.Checks {
		if c.Name == name && (subject == "" || c.Subject == subject) {
			out = append(out, c)
		}
	}
	return out
}

// Deps is what the checks read. Both are required.
type Deps struct {
	// Pool is the deployment's Postgres, with search_path at keyed's schema.
	Pool *pgxpool.Pool
	// Temporal is a client of the deployment's namespace.
	Temporal client.Client
}

// RetentionCheck is fxapp.CheckRetention's signature: it returns an error
// saying why retention is too short for runs as long as longestRun
// (retries and the decision timeout), or the error of DescribeNamespace.
type RetentionCheck func(ctx context.Context, c client.Client, namespace string, retention, longestRun time.Duration) error

// PoolSizing is the worker's database pool as configured, next to what it
// needs (fxapp.PoolNeeds).
type PoolSizing struct {
	// MaxConns is the pool size the worker runs with: pool_max_conns from
	// its DATABASE_URL, or Default.
	MaxConns int32 `json:"max_conns"`
	// Least is the fewest connections the worker can work with; Default is
	// the size it picks for its activity slots when none is set.
	Least, Default int32
	// Slots is WORKER_MAX_ACTIVITIES; Cores the cores Default was
	// figured for (the host the doctor runs on).
	Slots, Cores int
}

// Opts configures Run. Zero fields take the defaults named.
type Opts struct {
	// Checks names the checks to run. Nil means AllChecks.
	Checks []string
	// Namespace is the Temporal namespace the order runs live in. Required.
	Namespace string
	// Pipelines are the deployment's pipelines. Nil means
	// workflows.Pipelines().
	Pipelines []pipeline.Spec
	// Activities are the declared activities. Nil means
	// Declared(Pipelines).
	Activities []Activity
	// Window is how far back records and runs are read. Zero means 7 days.
	Window time.Duration
	// Sample is how many recent claims per activity are checked for their
	// key shape, and how many recent runs' histories are read for retries.
	// Zero means 200 and 100.
	Sample, HistorySample int

	// EffectsRetention is the workers' EFFECTS_RETENTION and
	// DecisionTimeout their DECISION_TIMEOUT. Zero means the defaults,
	// effects.DefaultRetention and 7 days.
	EffectsRetention, DecisionTimeout time.Duration
	// CheckRetention judges EffectsRetention; fxapp.CheckRetention in
	// production. Nil leaves the EFFECTS_RETENTION check as StatusError.
	CheckRetention RetentionCheck
	// IdempotencyRetention is how long the API keeps Idempotency-Keys. Zero
	// means config.IdempotencyRetention.
	IdempotencyRetention time.Duration
	// OutboxRetention is how long sent outbox rows are kept and
	// RelayMaxBackoff the relay's longest backoff. Zero means
	// outbox.DefaultRetention and outbox.DefaultMaxBackoff.
	OutboxRetention, RelayMaxBackoff time.Duration
	// ClaimLease is the effects client's lease. Zero means
	// effects.DefaultLease.
	ClaimLease time.Duration
	// LeafLimit is the size in bytes of an effect leaf, table and indexes,
	// above which the partitions check warns that retiring it frees too
	// much at once. Zero means 16 GiB.
	LeafLimit int64

	// SearchAttributes lists the search attributes that must be
	// registered. Nil means pipeline.SearchAttributes(Pipelines).
	SearchAttributes []pipeline.SearchAttribute
	// Pool is the worker's pool sizing. A zero MaxConns leaves the pool
	// check as StatusError.
	Pool PoolSizing
	// RulesFile is the deployed Prometheus rules file (a rule file or a
	// PrometheusRule manifest). Empty warns that it was not checked.
	RulesFile string
	// MetricsURL is a worker's /metrics, read for the suppression counter;
	// Gatherer is the same read in process (the worker's start-up report).
	// Neither means suppressions are not read, only the records.
	MetricsURL string
	Gatherer   prometheus.Gatherer
	// ReconcileEvery is how often reconciliation must succeed. Zero means
	// 25 hours (a daily job, an hour's slack).
	ReconcileEvery time.Duration
	// ProviderRates are the workers' bounds on each provider's calls per
	// second (STRIPE_CALLS_PER_SECOND...), one per provider, 0 unbounded.
	ProviderRates []ProviderRate
	// Now is the clock. Nil means time.Now.
	Now func() time.Time
}

// ProviderRate is one provider's configured bound: its steps' task queue
// and the activity rate limit the workers set on it.
type ProviderRate struct {
	Provider, Setting, TaskQueue string
	PerSecond                    float64
}

func (o *Opts) withDefaults() Opts {
	c := *o
	if c.Checks == nil {
		c.Checks = AllChecks
	}
	if c.Pipelines == nil {
		c.Pipelines = workflows.Pipelines()
	}
	if c.Activities == nil {
		c.Activities = Declared(c.Pipelines)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Window, 7*24*time.Hour)
	def(&c.EffectsRetention, effects.DefaultRetention)
	def(&c.DecisionTimeout, 7*24*time.Hour)
	def(&c.IdempotencyRetention, config.IdempotencyRetention)
	def(&c.OutboxRetention, outbox.DefaultRetention)
	def(&c.RelayMaxBackoff, outbox.DefaultMaxBackoff)
	def(&c.ClaimLease, effects.DefaultLease)
	def(&c.ReconcileEvery, 25*time.Hour)
	if c.LeafLimit == 0 {
		c.LeafLimit = 16 << 30
	}
	if c.Sample == 0 {
		c.Sample = 200
	}
	if c.HistorySample == 0 {
		c.HistorySample = 100
	}
	if c.SearchAttributes == nil {
		c.SearchAttributes = pipeline.SearchAttributes(c.Pipelines)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// run is one Run's state.
type run struct {
	deps Deps
	o    Opts
	now  time.Time
}

// Run runs the checks of opts against deps and returns the report; a check
// that cannot be made is reported with StatusError, so Run always returns a
// full report. It returns an error only for a nil Pool or Temporal client
// or an empty Namespace.
func Run(ctx context.Context, deps Deps, opts *Opts) (*Report, error) {
	if opts == nil {
		opts = &Opts{}
	}
	switch {
	case deps.Pool == nil:
		return nil, fmt.Errorf("doctor: Run: Pool is nil")
	case deps.Temporal == nil:
		return nil, fmt.Errorf("doctor: Run: Temporal client is nil")
	case opts.Namespace == "":
		return nil, fmt.Errorf("doctor: Run: Namespace is empty")
	}
	r := &run{deps: deps, o: opts.withDefaults()}
	r.now = r.o.Now()
	rep := &Report{Namespace: r.o.Namespace, At: r.now.UTC()}
	checks := map[string]func(context.Context) []Check{
		CheckClassified: r.classified, CheckTimeouts: r.timeouts, CheckLease: r.lease, CheckRetention: r.retention,
		CheckSearchAttributes: r.searchAttributes, CheckPool: r.pool, CheckDeadLetters: r.deadLetters,
		CheckSuppression: r.suppression, CheckReconcile: r.reconcile, CheckProviderRate: r.providerRates,
		CheckPartitions: r.partitions, CheckMigrations: r.schema,
	}
	for _, name := range AllChecks {
		if slices.Contains(r.o.Checks, name) {
			rep.Checks = append(rep.Checks, checks[name](ctx)...)
		}
	}
	rep.Exit = rep.ExitCode()
	return rep, nil
}

// errorCheck is a check that could not be made.
func errorCheck(name, subject string, err error, fix string) Check {
	return Check{Name: name, Subject: subject, Status: StatusError, Evidence: "could not check: " + err.Error(), Fix: fix}
}

// since is the start of the window.
func (r *run) since() time.Time { return r.now.Add(-r.o.Window) }

// ratio grades have against need: fail below 1×, warn below 3×.
func ratio(have, need time.Duration) Status {
	switch {
	case have < need:
		return StatusFail
	case have < 3*need:
		return StatusWarn
	}
	return StatusPass
}

// days renders d for people: "7d", "25h", "1h30m", "30m", "1.5s", "227ms".
func days(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d >= 48*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return strings.TrimSuffix(d.String(), "0s")
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// plural renders "1 run", "2 runs".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// times renders a ratio: "0.7", "2.5", "42".
func times(x float64) string {
	if x >= 10 {
		return fmt.Sprintf("%.0f", x)
	}
	return fmt.Sprintf("%.1f", x)
}
