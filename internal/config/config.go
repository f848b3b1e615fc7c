// Package config is keyed's typed runtime configuration for the worker and
// the starter. It reads environment variables, lets flags override the ones
// that are not secret, and validates everything at once, so that a bad
// deployment gets one message that lists every problem instead of a panic
// or a drip of errors one restart at a time.
//
// Secrets (STRIPE_SECRET_KEY, SENDGRID_API_KEY, the password in
// DATABASE_URL, and TEMPORAL_API_KEY and the Temporal client key, which may
// also come from the Temporal config file) come from the environment only,
// never from flags, which other users can read in the process list; and
// Config's String and LogValue redact them.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/mail"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/contrib/envconfig"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
)

// Role says which program the configuration is for; it decides which
// settings are required.
type Role int

// The programs that load a Config.
const (
	// Worker runs the order workflow and its activities: it needs the
	// providers' keys and the receipt sender.
	Worker Role = iota + 1
	// Starter creates orders and starts or inspects their checkout: it needs
	// Postgres and Temporal only.
	Starter
)

// String returns "worker" or "starter".
func (r Role) String() string {
	switch r {
	case Worker:
		return "worker"
	case Starter:
		return "starter"
	}
	return "role(" + strconv.Itoa(int(r)) + ")"
}

// Defaults of the optional settings.
const (
	DefaultDatabaseURL       = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	DefaultTemporalAddress   = "127.0.0.1:7233"
	DefaultTemporalNamespace = "default"
	DefaultStripeAPIBase     = "https://api.stripe.com"
	DefaultSendGridAPIBase   = "https://api.sendgrid.com"
	DefaultMetricsAddr       = "127.0.0.1:9464"
	DefaultReceiptPolicy     = AtMostOnce
	DefaultCollapseWindow    = 10 * time.Minute
	DefaultStopTimeout       = 30 * time.Second
	DefaultMaxActivities     = 64
	// DefaultDecisionTimeout is DECISION_TIMEOUT's default: a week.
	DefaultDecisionTimeout = 7 * 24 * time.Hour
	// DefaultPollers is WORKER_POLLERS's default, chosen with make
	// bench-pipeline (see README, "Performance").
	DefaultPollers          = 8
	DefaultEffectsRetention = effects.DefaultRetention
	DefaultPruneEvery       = time.Hour
	// DefaultAPIRateLimit and DefaultAPIRateBurst are KEYED_API_RATE_LIMIT's
	// and KEYED_API_RATE_BURST's defaults: 100 requests a second per tenant
	// in bursts of up to 200, as Stripe's live mode allows.
	DefaultAPIRateLimit = 100
	DefaultAPIRateBurst = 200
	// ProviderTimeout bounds one HTTP request to Stripe or SendGrid. An
	// ambiguous timeout is retried with the same idempotency key (or looked
	// up at SendGrid), so a short bound costs nothing but a retry.
	ProviderTimeout = 30 * time.Second
)

// Delivery policies for receipts (RECEIPT_POLICY).
const (
	// AtMostOnce claims before sending: a crash after the claim suppresses
	// the email and leaves a visible stuck claim.
	AtMostOnce = "at_most_once"
	// AtLeastOnce marks after sending: a crash between the send and the mark
	// may send twice, which the collapse window then usually drops.
	AtLeastOnce = "at_least_once"
)

// Config is the whole configuration. Each part is what one fx module needs.
type Config struct {
	Role     Role
	Database Database
	Temporal Temporal
	Stripe   Stripe
	SendGrid SendGrid
	Receipt  Receipt
	Metrics  Metrics
	Worker   WorkerTuning
	// RateLimit is the HTTP API's per-tenant limit (starter serve).
	RateLimit RateLimit
	// LogLevel is the minimum level logged (LOG_LEVEL: debug, info, warn,
	// error).
	LogLevel slog.Level
}

// Database is the Postgres connection.
type Database struct {
	// URL is DATABASE_URL. It may hold a password: never log it; use
	// Redacted.
	URL string
	// Migrate applies keyed's migrations when the program starts
	// (MIGRATE_ON_START, default true for the worker, false for the starter).
	Migrate bool
}

// Temporal is the Temporal frontend, how to connect to it, and where the
// order workflow runs. Address and Namespace come from the flags, else
// TEMPORAL_ADDRESS and TEMPORAL_NAMESPACE, else the Temporal config file's
// profile, else the defaults; the connection's security (TLS, mTLS, API
// key, gRPC headers) comes from the SDK's environment configuration: see
// ClientOptions. Its String, GoString and LogValue redact the secrets.
type Temporal struct {
	Address   string // TEMPORAL_ADDRESS, host:port
	Namespace string // TEMPORAL_NAMESPACE
	TaskQueue string // TEMPORAL_TASK_QUEUE
	// Profile is the config file profile in use (TEMPORAL_PROFILE), empty
	// for the default one.
	Profile string
	// conn is the profile read by the SDK's contrib/envconfig from the
	// config file (TEMPORAL_CONFIG_FILE) and the TEMPORAL_* variables: TLS,
	// client certificate, API key, gRPC headers. Its Address and Namespace
	// are the profile's own; the fields above win. It holds secrets.
	conn envconfig.ClientConfigProfile
}

// Stripe is the Stripe API the charge activity calls.
type Stripe struct {
	SecretKey string // STRIPE_SECRET_KEY, sk_… or rk_…; a secret
	APIBase   string // STRIPE_API_BASE, so that stripe-mock or a fake can stand in
}

// SendGrid is the SendGrid API the receipt activity calls.
type SendGrid struct {
	APIKey  string // SENDGRID_API_KEY; a secret
	APIBase string // SENDGRID_API_BASE
	// LookupLag is SENDGRID_LOOKUP_LAG: how long SendGrid's Email Activity
	// index may lag a send. A retry that finds no message under its effect
	// key waits this long after the possible send before sending.
	LookupLag time.Duration
	// LookupGiveUp is SENDGRID_LOOKUP_GIVE_UP: how much longer a failing
	// look-up is retried before the receipt policy decides.
	LookupGiveUp time.Duration
}

// Receipt configures the receipt email.
type Receipt struct {
	// From is RECEIPT_FROM, the sender address, such as
	// "Keyed Receipts <receipts@example.com>".
	From string
	// Policy is RECEIPT_POLICY, AtMostOnce or AtLeastOnce.
	Policy string
	// CollapseWindow is COLLAPSE_WINDOW: a repeat receipt to the same
	// recipient for the same order within it is dropped. It must be positive.
	CollapseWindow time.Duration
}

// Metrics is where the worker serves /metrics and /healthz.
type Metrics struct {
	Addr string // METRICS_ADDR, host:port; port 0 picks a free one
}

// RateLimit is the HTTP API's per-tenant rate limit (api.RateLimit): a
// token bucket per tenant in each API process.
type RateLimit struct {
	// Rate is KEYED_API_RATE_LIMIT: the requests a second each tenant may
	// send to one API process, sustained. 0 turns the limit off.
	Rate float64
	// Burst is KEYED_API_RATE_BURST: how many requests a tenant may send at
	// once after a quiet spell. At least 1 while the limit is on.
	Burst int
}

// WorkerTuning holds the Temporal worker's knobs.
type WorkerTuning struct {
	// StopTimeout is WORKER_STOP_TIMEOUT: on SIGTERM the worker stops
	// polling and waits this long for in-flight activities before
	// cancelling them.
	StopTimeout time.Duration
	// MaxConcurrentActivities is WORKER_MAX_ACTIVITIES, the cap on activities
	// this process runs at once.
	MaxConcurrentActivities int
	// DecisionTimeout is DECISION_TIMEOUT: how long an order or refund run waits for
	// an operator's decision on an outcome keyed cannot know before it fails.
	DecisionTimeout time.Duration
	// Pollers is WORKER_POLLERS: how many workflow-task and how many
	// activity-task pollers the worker runs. The SDK's default of 2 starves
	// workflow tasks on a busy queue (see DefaultPollers).
	Pollers int
	// EffectsRetention is EFFECTS_RETENTION: finished effect records older
	// than this are pruned. It must outlive the longest retry window plus
	// the time a failed run may wait for a replay.
	EffectsRetention time.Duration
	// PruneEvery is PRUNE_EVERY: the window in which one replica prunes.
	PruneEvery time.Duration
}

// Loader reads a Config in two phases, so that a program can add its own
// flags next to the configuration's: NewLoader reads defaults and the
// environment, BindFlags adds the overriding flags to a FlagSet, and Load,
// called after the FlagSet is parsed, validates.
type Loader struct {
	cfg   Config
	level string
	// envProblems holds the variables that did not parse, by name; a flag
	// given for the same setting overrides the problem.
	envProblems map[string]string
	// problems are those added by Problem, reported whatever the flags.
	problems []string
	// flagOf names the flag of each variable a program added with Bool.
	flagOf map[string]string
	omit   map[FlagGroup]bool
	lookup func(string) (string, bool)
	fs     *flag.FlagSet
}

// FlagGroup is a group of settings that a program may leave out with
// Omit, because it never uses them.
type FlagGroup int

// The groups Omit accepts.
const (
	// TemporalFlags are TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE and
	// TEMPORAL_TASK_QUEUE with their flags --temporal-address,
	// --temporal-namespace and --task-queue, and the connection's other
	// TEMPORAL_* settings (TLS, API key, config file and profile).
	TemporalFlags FlagGroup = iota + 1
	// MigrateFlag is MIGRATE_ON_START and its flag --migrate.
	MigrateFlag
)

// NewLoader returns a Loader for role holding the defaults overridden by
// the environment, read through lookup (normally os.LookupEnv).
func NewLoader(role Role, lookup func(string) (string, bool)) *Loader {
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	l := &Loader{lookup: lookup}
	c := &l.cfg
	c.Role = role
	str := func(dst *string, name, def string) {
		*dst = def
		if v, ok := lookup(name); ok && strings.TrimSpace(v) != "" {
			*dst = strings.TrimSpace(v)
		}
	}
	dur := func(dst *time.Duration, name string, def time.Duration) {
		*dst = def
		if v, ok := lookup(name); ok && strings.TrimSpace(v) != "" {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil {
				l.problem(name, "%q is not a duration such as 30s or 10m", v)
				return
			}
			*dst = d
		}
	}
	boolean := func(dst *bool, name string, def bool) { *dst = l.readBool(name, def) }
	integer := func(dst *int, name string, def int) {
		*dst = def
		if v, ok := lookup(name); ok && strings.TrimSpace(v) != "" {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				l.problem(name, "%q is not a whole number", v)
				return
			}
			*dst = n
		}
	}
	number := func(dst *float64, name string, def float64) {
		*dst = def
		if v, ok := lookup(name); ok && strings.TrimSpace(v) != "" {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				l.problem(name, "%q is not a number such as 100 or 0.5", v)
				return
			}
			*dst = f
		}
	}

	str(&c.Database.URL, "DATABASE_URL", DefaultDatabaseURL)
	boolean(&c.Database.Migrate, "MIGRATE_ON_START", role == Worker)
	l.loadTemporal()
	str(&c.Temporal.TaskQueue, "TEMPORAL_TASK_QUEUE", orders.TaskQueue)
	// A one-shot CLI is quiet unless asked; a server logs its lifecycle.
	defaultLevel := "info"
	if role == Starter {
		defaultLevel = "warn"
	}
	str(&l.level, "LOG_LEVEL", defaultLevel)
	if role == Starter {
		number(&c.RateLimit.Rate, "KEYED_API_RATE_LIMIT", DefaultAPIRateLimit)
		integer(&c.RateLimit.Burst, "KEYED_API_RATE_BURST", DefaultAPIRateBurst)
	}
	if role != Worker {
		return l
	}
	str(&c.Stripe.SecretKey, "STRIPE_SECRET_KEY", "")
	str(&c.Stripe.APIBase, "STRIPE_API_BASE", DefaultStripeAPIBase)
	str(&c.SendGrid.APIKey, "SENDGRID_API_KEY", "")
	str(&c.SendGrid.APIBase, "SENDGRID_API_BASE", DefaultSendGridAPIBase)
	dur(&c.SendGrid.LookupLag, "SENDGRID_LOOKUP_LAG", notify.DefaultLookupLag)
	dur(&c.SendGrid.LookupGiveUp, "SENDGRID_LOOKUP_GIVE_UP", notify.DefaultLookupGiveUp)
	str(&c.Receipt.From, "RECEIPT_FROM", "")
	str(&c.Receipt.Policy, "RECEIPT_POLICY", DefaultReceiptPolicy)
	dur(&c.Receipt.CollapseWindow, "COLLAPSE_WINDOW", DefaultCollapseWindow)
	str(&c.Metrics.Addr, "METRICS_ADDR", DefaultMetricsAddr)
	dur(&c.Worker.StopTimeout, "WORKER_STOP_TIMEOUT", DefaultStopTimeout)
	integer(&c.Worker.MaxConcurrentActivities, "WORKER_MAX_ACTIVITIES", DefaultMaxActivities)
	integer(&c.Worker.Pollers, "WORKER_POLLERS", DefaultPollers)
	dur(&c.Worker.DecisionTimeout, "DECISION_TIMEOUT", DefaultDecisionTimeout)
	dur(&c.Worker.EffectsRetention, "EFFECTS_RETENTION", DefaultEffectsRetention)
	dur(&c.Worker.PruneEvery, "PRUNE_EVERY", DefaultPruneEvery)
	return l
}

// BindFlags adds to fs a flag for each setting of the Loader's role that is
// not a secret, defaulting to the value read from the environment. Flags
// win over the environment once fs is parsed.
func (l *Loader) BindFlags(fs *flag.FlagSet) {
	l.fs = fs
	c := &l.cfg
	if !l.omit[TemporalFlags] {
		fs.StringVar(&c.Temporal.Address, "temporal-address", c.Temporal.Address, "Temporal frontend `host:port` (env TEMPORAL_ADDRESS)")
		fs.StringVar(&c.Temporal.Namespace, "temporal-namespace", c.Temporal.Namespace, "Temporal `namespace` (env TEMPORAL_NAMESPACE)")
		fs.StringVar(&c.Temporal.TaskQueue, "task-queue", c.Temporal.TaskQueue, "Temporal task `queue` of the order workflow (env TEMPORAL_TASK_QUEUE)")
	}
	fs.StringVar(&l.level, "log-level", l.level, "minimum log `level`: debug, info, warn or error (env LOG_LEVEL)")
	if !l.omit[MigrateFlag] {
		fs.BoolVar(&c.Database.Migrate, "migrate", c.Database.Migrate, "apply keyed's database migrations on start (env MIGRATE_ON_START)")
	}
	if l.cfg.Role != Worker {
		return
	}
	fs.StringVar(&c.Stripe.APIBase, "stripe-api-base", c.Stripe.APIBase, "Stripe API base `URL`, e.g. a stripe-mock or fake (env STRIPE_API_BASE)")
	fs.StringVar(&c.SendGrid.APIBase, "sendgrid-api-base", c.SendGrid.APIBase, "SendGrid API base `URL` (env SENDGRID_API_BASE)")
	fs.StringVar(&c.Receipt.From, "receipt-from", c.Receipt.From, "receipt sender `address` (env RECEIPT_FROM)")
	fs.StringVar(&c.Receipt.Policy, "receipt-policy", c.Receipt.Policy, "receipt delivery `policy`: at_most_once or at_least_once (env RECEIPT_POLICY)")
	fs.DurationVar(&c.Receipt.CollapseWindow, "collapse-window", c.Receipt.CollapseWindow, "drop a repeat receipt to the same recipient for the same order within this `duration` (env COLLAPSE_WINDOW)")
	fs.StringVar(&c.Metrics.Addr, "metrics-addr", c.Metrics.Addr, "`host:port` serving /metrics and /healthz (env METRICS_ADDR)")
	fs.DurationVar(&c.Worker.StopTimeout, "stop-timeout", c.Worker.StopTimeout, "on SIGTERM, how long to wait for in-flight activities (env WORKER_STOP_TIMEOUT)")
	fs.IntVar(&c.Worker.MaxConcurrentActivities, "max-activities", c.Worker.MaxConcurrentActivities, "most activities run at once by this worker (env WORKER_MAX_ACTIVITIES)")
	fs.IntVar(&c.Worker.Pollers, "pollers", c.Worker.Pollers, "workflow-task and activity-task pollers, each (env WORKER_POLLERS)")
}

// Load validates the configuration and returns it. The error lists every
// problem, one variable per line, and never contains a secret.
func (l *Loader) Load() (*Config, error) {
	c := l.cfg
	var problems []string
	set := map[string]bool{}
	if l.fs != nil {
		l.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	}
	for name, p := range l.envProblems {
		if l.omitted(name) {
			continue
		}
		if fl := l.flagName(name); fl == "" || !set[fl] {
			problems = append(problems, p)
		}
	}
	problems = append(problems, l.problems...)
	add := func(name, format string, args ...any) {
		if l.omitted(name) {
			return
		}
		if fl := l.flagName(name); fl != "" && l.hasFlag(fl) {
			name += " (--" + fl + ")"
		}
		problems = append(problems, name+": "+fmt.Sprintf(format, args...))
	}
	if l.omit[MigrateFlag] {
		c.Database.Migrate = false
	}

	if _, err := pgxpool.ParseConfig(c.Database.URL); err != nil {
		// pgx's message quotes the string, password and all: say it ourselves.
		add("DATABASE_URL", "not a Postgres connection string (want postgres://user[:password]@host:5432/db?sslmode=disable)")
	}
	if err := CheckHostPort(c.Temporal.Address); err != nil {
		add("TEMPORAL_ADDRESS", "%v", err)
	}
	if c.Temporal.Namespace == "" {
		add("TEMPORAL_NAMESPACE", "must not be empty")
	}
	if c.Temporal.TaskQueue == "" {
		add("TEMPORAL_TASK_QUEUE", "must not be empty")
	}
	if !l.omit[TemporalFlags] {
		l.checkTemporal(c.Temporal, add)
	}
	switch strings.ToLower(l.level) {
	case "debug":
		c.LogLevel = slog.LevelDebug
	case "info", "":
		c.LogLevel = slog.LevelInfo
	case "warn", "warning":
		c.LogLevel = slog.LevelWarn
	case "error":
		c.LogLevel = slog.LevelError
	default:
		add("LOG_LEVEL", "%q is not debug, info, warn or error", l.level)
	}

	if c.Role == Starter {
		switch r := c.RateLimit.Rate; {
		case r < 0 || math.IsNaN(r) || math.IsInf(r, 0):
			add("KEYED_API_RATE_LIMIT", "%v must be a number of requests a second, at least 0 (0 turns the limit off)", r)
		case r > 0 && c.RateLimit.Burst < 1:
			add("KEYED_API_RATE_BURST", "%d must be at least 1 while KEYED_API_RATE_LIMIT is on", c.RateLimit.Burst)
		}
	}
	if c.Role == Worker {
		switch {
		case c.Stripe.SecretKey == "":
			add("STRIPE_SECRET_KEY", "required (a Stripe secret key sk_… or restricted key rk_…; sk_test_… for test mode)")
		case !strings.HasPrefix(c.Stripe.SecretKey, "sk_") && !strings.HasPrefix(c.Stripe.SecretKey, "rk_"):
			add("STRIPE_SECRET_KEY", "must start with sk_ or rk_ (is it a publishable pk_ key?)")
		}
		if err := CheckBaseURL(c.Stripe.APIBase); err != nil {
			add("STRIPE_API_BASE", "%v", err)
		}
		if c.SendGrid.APIKey == "" {
			add("SENDGRID_API_KEY", "required (a SendGrid API key, SG.…)")
		}
		if err := CheckBaseURL(c.SendGrid.APIBase); err != nil {
			add("SENDGRID_API_BASE", "%v", err)
		}
		if c.Receipt.From == "" {
			add("RECEIPT_FROM", "required (the receipts' sender, such as receipts@example.com)")
		} else if _, err := mail.ParseAddress(c.Receipt.From); err != nil {
			add("RECEIPT_FROM", "%q is not an email address", c.Receipt.From)
		}
		if c.Receipt.Policy != AtMostOnce && c.Receipt.Policy != AtLeastOnce {
			add("RECEIPT_POLICY", "%q is not %s or %s", c.Receipt.Policy, AtMostOnce, AtLeastOnce)
		}
		if c.SendGrid.LookupLag <= 0 {
			add("SENDGRID_LOOKUP_LAG", "%s must be positive", c.SendGrid.LookupLag)
		}
		if c.SendGrid.LookupGiveUp <= 0 {
			add("SENDGRID_LOOKUP_GIVE_UP", "%s must be positive", c.SendGrid.LookupGiveUp)
		}
		if least := ProviderTimeout + c.SendGrid.LookupLag; c.Receipt.CollapseWindow < least {
			add("COLLAPSE_WINDOW", "%s is shorter than the provider timeout plus SENDGRID_LOOKUP_LAG (%s): "+
				"its rows date a possible send while SendGrid's index catches up", c.Receipt.CollapseWindow, least)
		}
		if err := CheckHostPort(c.Metrics.Addr); err != nil {
			add("METRICS_ADDR", "%v", err)
		}
		if c.Worker.StopTimeout <= 0 {
			add("WORKER_STOP_TIMEOUT", "%s must be positive", c.Worker.StopTimeout)
		}
		if c.Worker.EffectsRetention < time.Hour {
			add("EFFECTS_RETENTION", "%s is under one hour; effect records must outlive the retry window", c.Worker.EffectsRetention)
		}
		if c.Worker.PruneEvery < time.Minute {
			add("PRUNE_EVERY", "%s is under one minute", c.Worker.PruneEvery)
		}
		if c.Worker.DecisionTimeout < time.Minute {
			add("DECISION_TIMEOUT", "%s is under a minute; an operator needs time to look", c.Worker.DecisionTimeout)
		}
		if c.Worker.Pollers < 2 || c.Worker.Pollers > 64 {
			add("WORKER_POLLERS", "%d is not between 2 and 64", c.Worker.Pollers)
		}
		if c.Worker.MaxConcurrentActivities <= 0 {
			add("WORKER_MAX_ACTIVITIES", "%d must be positive", c.Worker.MaxConcurrentActivities)
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, &Error{Role: c.Role, Problems: problems}
	}
	return &c, nil
}

// Omit leaves groups out: BindFlags adds no flag for them and Load does
// not check them, for a program that never uses those settings. Call it
// before BindFlags.
func (l *Loader) Omit(groups ...FlagGroup) {
	if l.omit == nil {
		l.omit = map[FlagGroup]bool{}
	}
	for _, g := range groups {
		l.omit[g] = true
	}
}

// Bool reads the boolean variable name (true or false, 1 or 0, as
// strconv.ParseBool), or def when it is unset. Any other value is a problem
// that Load reports with the others, unless the program's flag flagName is
// given on the command line; flagName may be empty.
func (l *Loader) Bool(name, flagName string, def bool) bool {
	if flagName != "" {
		if l.flagOf == nil {
			l.flagOf = map[string]string{}
		}
		l.flagOf[name] = flagName
	}
	return l.readBool(name, def)
}

// Problem adds a problem with the setting name (a variable or a flag) that
// Load reports with the others. The message must not hold a secret.
func (l *Loader) Problem(name, format string, args ...any) {
	l.problems = append(l.problems, name+": "+fmt.Sprintf(format, args...))
}

func (l *Loader) readBool(name string, def bool) bool {
	v, ok := l.lookup(name)
	if !ok || strings.TrimSpace(v) == "" {
		return def
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		l.problem(name, "%q is not true or false (also accepted: 1, 0, t, f)", quote(v))
		return def
	}
	return b
}

func (l *Loader) flagName(name string) string {
	if fl := l.flagOf[name]; fl != "" {
		return fl
	}
	return flagOf[name]
}

func (l *Loader) hasFlag(name string) bool {
	return l.fs != nil && l.fs.Lookup(name) != nil
}

// omitted reports whether the variable name belongs to an omitted group.
func (l *Loader) omitted(name string) bool {
	switch {
	case strings.HasPrefix(name, "TEMPORAL_"):
		return l.omit[TemporalFlags]
	case name == "MIGRATE_ON_START":
		return l.omit[MigrateFlag]
	}
	return false
}

func (l *Loader) problem(name, format string, args ...any) {
	if l.envProblems == nil {
		l.envProblems = map[string]string{}
	}
	l.envProblems[name] = name + ": " + fmt.Sprintf(format, args...)
}

// Error lists every configuration problem found by Load.
type Error struct {
	Role     Role
	Problems []string // "VARIABLE: what is wrong", sorted
}

// Error lists the problems, one a line.
func (e *Error) Error() string {
	return fmt.Sprintf("invalid %s configuration (%d problems):\n  %s", e.Role, len(e.Problems), strings.Join(e.Problems, "\n  "))
}

// ErrInvalid is matched by errors.Is for every *Error.
var ErrInvalid = errors.New("invalid configuration")

// Is reports whether target is ErrInvalid.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// CheckHostPort returns an error unless s is a listen or dial address
// "host:port": host empty, an IP address or a DNS name, and port a number
// from 0 to 65535. The error quotes s with anything before an '@' left out.
func CheckHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not host:port", quote(s))
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: port %q is not a number from 0 to 65535", quote(s), port)
	}
	ip, _, _ := strings.Cut(host, "%") // an IPv6 zone, as in [fe80::1%eth0]
	if host != "" && net.ParseIP(ip) == nil && !isDNSName(host) {
		return fmt.Errorf("%q: host %q is not an IP address or a DNS name", quote(s), quote(host))
	}
	return nil
}

// isDNSName reports whether s is a syntactically valid DNS name: labels of
// letters, digits and inner hyphens (underscores tolerated), 1 to 63 bytes
// each, 253 in all.
func isDNSName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// CheckBaseURL returns an error unless s is an http or https URL with a
// host and without credentials. The error never holds the URL's userinfo.
func CheckBaseURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a URL", quote(s))
	}
	if u.User != nil {
		u.User = nil
		return fmt.Errorf("%q carries credentials (user:password@): give the API's key in its own variable", u.String())
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL", u.String())
	}
	return nil
}

// quote returns s for an error message with any userinfo left out: what
// precedes the last '@' before the first '/' after "scheme://" (or in the
// whole string, when it has no scheme) becomes "…".
func quote(s string) string {
	rest, prefix := s, ""
	if i := strings.Index(s, "://"); i >= 0 {
		prefix, rest = s[:i+3], s[i+3:]
	}
	end := len(rest)
	if j := strings.IndexByte(rest, '/'); j >= 0 {
		end = j
	}
	if at := strings.LastIndexByte(rest[:end], '@'); at >= 0 {
		return prefix + "…" + rest[at:]
	}
	return s
}

// Load is NewLoader, BindFlags, fs.Parse(args) and Load in one call, for a
// program whose only flags are the configuration's. A flag error is
// returned as is (flag.ErrHelp for -h).
func Load(role Role, fs *flag.FlagSet, args []string, lookup func(string) (string, bool)) (*Config, error) {
	l := NewLoader(role, lookup)
	l.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%s: unexpected arguments: %s", role, strings.Join(fs.Args(), " "))
	}
	return l.Load()
}

// flagOf names the flag that overrides an environment variable, for
// messages.
var flagOf = map[string]string{
	"TEMPORAL_ADDRESS":      "temporal-address",
	"TEMPORAL_NAMESPACE":    "temporal-namespace",
	"TEMPORAL_TASK_QUEUE":   "task-queue",
	"LOG_LEVEL":             "log-level",
	"STRIPE_API_BASE":       "stripe-api-base",
	"SENDGRID_API_BASE":     "sendgrid-api-base",
	"RECEIPT_FROM":          "receipt-from",
	"RECEIPT_POLICY":        "receipt-policy",
	"COLLAPSE_WINDOW":       "collapse-window",
	"METRICS_ADDR":          "metrics-addr",
	"WORKER_STOP_TIMEOUT":   "stop-timeout",
	"WORKER_MAX_ACTIVITIES": "max-activities",
	"WORKER_POLLERS":        "pollers",
}

// PrintFlags writes the flags of fs to w spelled as usage lines spell them,
// "--name value", each followed by its usage indented and its default
// unless that is the zero value. Strings' defaults are quoted.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		var b strings.Builder
		b.WriteString("  --" + f.Name)
		if name != "" {
			b.WriteString(" " + name)
		}
		b.WriteString("\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t"))
		if d := defaultOf(f); d != "" {
			b.WriteString(" (default " + d + ")")
		}
		fmt.Fprintln(w, b.String())
	})
}

// defaultOf returns f's default for help, or "" when it is the zero value.
func defaultOf(f *flag.Flag) string {
	switch f.DefValue {
	case "", "0", "false", "0s":
		return ""
	}
	if g, ok := f.Value.(flag.Getter); ok {
		if _, isString := g.Get().(string); isString {
			return strconv.Quote(f.DefValue)
		}
	}
	return f.DefValue
}
