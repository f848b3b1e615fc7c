package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/sdk/contrib/envconfig"

	"github.com/keyedhq/keyed/effects"
)

// Role says which program the configuration is for.
type Role int

// The programs that load a Config.
const (
	// Worker runs the order workflow and its activities: it needs the
	// providers' keys and the receipt sender.
	Worker Role = iota + 1
	// Starter creates orders and starts or inspects their checkout: it needs
	// Postgres and Temporal, and each command its own settings (Command).
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

// uses returns the programs r stands for on its own.
func (r Role) uses() Uses {
	switch r {
	case Worker:
		return InWorker
	case Starter:
		return InStarter
	}
	return 0
}

// Uses is a set of the programs that read a setting (Setting.For).
type Uses uint16

// The programs: the worker, every starter command, single starter
// commands, and keyed's tests and tools.
const (
	InWorker Uses = 1 << iota
	InStarter
	InServe
	InReconcile
	InResolve
	InDoctor
	InTests
)

// programs names each Uses bit; command is the starter command it stands
// for, if any.
var programs = []struct {
	use           Uses
	name, command string
}{
	{InWorker, "worker", ""},
	{InStarter, "starter", ""},
	{InServe, "starter serve", "serve"},
	{InReconcile, "starter reconcile", "reconcile"},
	{InResolve, "starter resolve", "resolve"},
	{InDoctor, "starter doctor", "doctor"},
	{InTests, "tests", ""},
}

// String names the programs in u, as "worker, starter serve".
func (u Uses) String() string {
	var names []string
	for _, p := range programs {
		if u&p.use != 0 {
			names = append(names, p.name)
		}
	}
	return strings.Join(names, ", ")
}

// CommandUses returns the bit of the starter command name, or 0 for a
// command that reads only the settings every command reads.
func CommandUses(name string) Uses {
	for _, p := range programs {
		if p.command != "" && p.command == name {
			return p.use
		}
	}
	return 0
}

// Defaults of the optional settings.
const (
	DefaultDatabaseURL       = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	DefaultTemporalAddress   = "127.0.0.1:7233"
	DefaultTemporalNamespace = "default"
	// DefaultGRPCCompression is TEMPORAL_GRPC_COMPRESSION's default.
	DefaultGRPCCompression = CompressionGzip
	DefaultStripeAPIBase   = "https://api.stripe.com"
	DefaultSendGridAPIBase = "https://api.sendgrid.com"
	DefaultMetricsAddr     = "127.0.0.1:9464"
	// DefaultServeMetricsAddr is METRICS_ADDR's default for starter serve:
	// beside a worker's on one host, and never the API's port.
	DefaultServeMetricsAddr = "127.0.0.1:9466"
	DefaultAPIAddr          = "127.0.0.1:8080"
	DefaultReceiptPolicy    = AtMostOnce
	DefaultCollapseWindow   = 10 * time.Minute
	DefaultStopTimeout      = 30 * time.Second
	DefaultMaxActivities    = 64
	// MaxActivities bounds WORKER_MAX_ACTIVITIES: far above what one
	// process serves, far below what would exhaust it.
	MaxActivities = 4096
	// DefaultDecisionTimeout is DECISION_TIMEOUT's default: a week.
	DefaultDecisionTimeout = 7 * 24 * time.Hour
	// DefaultPollers is WORKER_POLLERS's default, chosen with make
	// bench-pipeline (see docs/benchmarks.md).
	DefaultPollers          = 8
	DefaultEffectsRetention = effects.DefaultRetention
	// DefaultMoneyRetention keeps charge and refund records half a year:
	// card networks allow disputes for up to 120 days and more.
	DefaultMoneyRetention = 180 * 24 * time.Hour
	// IdempotencyRetention is how long the API keeps a stored response
	// replayable under its Idempotency-Key (api.Retention): 24 hours, as at
	// Stripe. EFFECTS_RETENTION must cover it.
	IdempotencyRetention = 24 * time.Hour
	DefaultPruneEvery    = time.Hour
	// DefaultSettleEvery is SETTLE_EVERY's default.
	DefaultSettleEvery = time.Minute
	// DefaultReconcileEvery is RECONCILE_EVERY's default.
	DefaultReconcileEvery = time.Hour
	// DefaultAPIRateLimit and DefaultAPIRateBurst are KEYED_API_RATE_LIMIT's
	// and KEYED_API_RATE_BURST's defaults: 100 requests a second per tenant
	// in bursts of up to 200, as Stripe's live mode allows.
	DefaultAPIRateLimit = 100
	DefaultAPIRateBurst = 200
	// DefaultAPIMaxWait is KEYED_API_MAX_WAIT's default.
	DefaultAPIMaxWait = 10 * time.Second
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

// Config is the whole configuration. Each part is what one fx module
// needs; each field is filled by one row of Settings, which names it.
type Config struct {
	Role     Role
	Database Database
	Temporal Temporal
	Stripe   Stripe
	SendGrid SendGrid
	Receipt  Receipt
	Metrics  Metrics
	Worker   WorkerTuning
	// API is starter serve's HTTP API.
	API API
	// LogLevel is the minimum level logged (LOG_LEVEL).
	LogLevel slog.Level
	// NotSettings is the variables of other programs, comma-separated,
	// that the misspelling check lets through (KEYED_NOT_SETTINGS).
	NotSettings string

	// uses and omit are the programs the Loader read for and the groups
	// it left out, for String and LogValue.
	uses Uses
	omit map[FlagGroup]bool
}

// Secret is a setting that must never be shown: a key or a password. It
// prints as its kind ("sk_test_…(redacted)", "(unset)") whatever the
// verb, in logs and in text; convert it with string(s) where it is used.
type Secret string

// Format writes the redacted form of s, for every verb.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redactKey(string(s))) }

// LogValue implements slog.LogValuer: the redacted form of s.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redactKey(string(s))) }

// MarshalText returns the redacted form of s, for encoders.
func (s Secret) MarshalText() ([]byte, error) { return []byte(redactKey(string(s))), nil }

// Database is the Postgres connection.
type Database struct {
	// URL is DATABASE_URL. It may hold a password: never log it; use
	// Redacted.
	URL string
	// Migrate applies keyed's migrations when the program starts
	// (MIGRATE_ON_START).
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
	// Compression is TEMPORAL_GRPC_COMPRESSION: CompressionGzip or
	// CompressionNone.
	Compression string
	// Profile is the config file profile in use (TEMPORAL_PROFILE), empty
	// for the default one.
	Profile string
	// RelayConcurrency is RELAY_CONCURRENCY: the most workflow starts one
	// outbox relay has in flight (outbox.RelayOpts.Concurrency).
	RelayConcurrency int
	// conn is the profile read by the SDK's contrib/envconfig from the
	// config file (TEMPORAL_CONFIG_FILE) and the TEMPORAL_* variables: TLS,
	// client certificate, API key, gRPC headers. Its Address and Namespace
	// are the profile's own; the fields above win. It holds secrets.
	conn envconfig.ClientConfigProfile
}

// The values of TEMPORAL_GRPC_COMPRESSION.
const (
	CompressionGzip = "gzip"
	CompressionNone = "none"
)

// Stripe is the Stripe API the charge activity calls.
type Stripe struct {
	SecretKey Secret // STRIPE_SECRET_KEY, sk_… or rk_…
	APIBase   string // STRIPE_API_BASE, so that stripe-mock or a fake can stand in
	// CallsPerSecond is STRIPE_CALLS_PER_SECOND: the Stripe steps started
	// per second across all workers (their own task queue's activity rate
	// limit). 0 runs them on the worker's queue, unbounded.
	CallsPerSecond float64
}

// SendGrid is the SendGrid API the receipt activity calls.
type SendGrid struct {
	APIKey  Secret // SENDGRID_API_KEY
	APIBase string // SENDGRID_API_BASE
	// CallsPerSecond is SENDGRID_CALLS_PER_SECOND, as Stripe's.
	CallsPerSecond float64
	// LookupLag is SENDGRID_LOOKUP_LAG: how long SendGrid's Email Activity
	// index may lag a send.
	LookupLag time.Duration
	// LookupGiveUp is SENDGRID_LOOKUP_GIVE_UP: how much longer a failing
	// look-up is retried before the receipt policy decides.
	LookupGiveUp time.Duration
}

// Receipt configures the receipt email.
type Receipt struct {
	From           string        // RECEIPT_FROM, the sender address
	Policy         string        // RECEIPT_POLICY, AtMostOnce or AtLeastOnce
	CollapseWindow time.Duration // COLLAPSE_WINDOW
}

// Metrics is where the worker serves /metrics and /healthz.
type Metrics struct {
	Addr string // METRICS_ADDR, host:port; port 0 picks a free one
}

// API is starter serve's HTTP API.
type API struct {
	Addr     string // KEYED_API_ADDR, host:port
	Relay    bool   // KEYED_SERVE_RELAY: also run an outbox relay
	Keys     Secret // KEYED_API_KEYS, "tenant=key,…" (api.KeysFrom)
	KeysFile string // KEYED_API_KEYS_FILE, one tenant=key a line
	// RateLimit is the per-tenant limit.
	RateLimit RateLimit
	// MaxWait is KEYED_API_MAX_WAIT: the longest Prefer: wait honoured; 0
	// ignores the preference.
	MaxWait time.Duration
	// MaxConns is KEYED_API_MAX_CONNECTIONS: the most connections the API
	// holds open (api.ServerOpts.MaxConns); 0 means api.DefaultMaxConns.
	MaxConns int
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
	// MaxConcurrentActivities is WORKER_MAX_ACTIVITIES.
	MaxConcurrentActivities int
	// TenantShare is WORKER_TENANT_SHARE: how many of those slots one
	// tenant's activities may hold at once; 0 means
	// slotshare.DefaultShare.
	TenantShare int
	// DecisionTimeout is DECISION_TIMEOUT: how long an order or refund run
	// waits for an operator's decision before it fails.
	DecisionTimeout time.Duration
	// Pollers is WORKER_POLLERS: how many activity-task pollers the worker
	// runs, and at most how many workflow-task pollers on each of the task
	// queue and its sticky queue.
	Pollers int
	// EffectsRetention is EFFECTS_RETENTION: finished effect records older
	// than this are pruned.
	EffectsRetention time.Duration
	// MoneyRetention is MONEY_RETENTION: how long charge and refund
	// records are kept (steps declared with step.KeepMoney).
	MoneyRetention time.Duration
	// LeavesPerLifetime is EFFECTS_LEAVES_PER_LIFETIME: how many leaves
	// each kind's lifetime is cut into (effects.SetLifetimesOpts).
	LeavesPerLifetime int
	// PruneEvery is PRUNE_EVERY: the window in which one replica prunes.
	PruneEvery time.Duration
	// SettleEvery is SETTLE_EVERY: the window in which one replica settles
	// waiting runs from provider evidence.
	SettleEvery time.Duration
	// ReconcileEvery is RECONCILE_EVERY: the window in which one replica
	// reconciles with Stripe.
	ReconcileEvery time.Duration
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

// checkHostPort returns an error unless s is a listen or dial address
// "host:port": host empty, an IP address or a DNS name, and port a number
// from 0 to 65535. The error quotes s with anything before an '@' left out.
func checkHostPort(s string) error {
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

// checkBaseURL returns an error unless s is an http or https URL with a
// host and without credentials. The error never holds the URL's userinfo.
func checkBaseURL(s string) error {
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
