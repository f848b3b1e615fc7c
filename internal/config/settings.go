package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/mail"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

// Setting is one row of Settings: one environment variable, the flag that
// overrides it, and everything the loader, the usage text and the docs
// page say about it.
type Setting struct {
	// Env is the environment variable. A name ending in "*" stands for a
	// family of variables that another reader takes (OTEL_*).
	Env string
	// Flag is the flag that overrides Env, without dashes; empty for none.
	// A Secret has none.
	Flag string
	// Field is the path of the Config field the setting fills, such as
	// "Receipt.CollapseWindow". Its type decides how the value is parsed:
	// string, Secret, bool, int, float64, time.Duration or slog.Level.
	// Empty for a variable that another reader takes: the Temporal SDK,
	// OpenTelemetry, the Go runtime, the tests.
	Field string
	// For is the programs that read the setting; Required, those of them
	// that refuse to start while it is empty.
	For, Required Uses
	// Group lets a program that never uses the setting leave it out
	// (Loader.Omit).
	Group FlagGroup
	// Default is the value when neither the variable nor the flag is set:
	// of the field's type, or a ByRole of such values. DefaultDoc, when
	// set, is shown instead in the usage text and the docs.
	Default    any
	DefaultDoc string
	// Secret settings come from the environment only, never from a flag,
	// and are never shown: their field is a Secret, or Redact shows what
	// may be shown of them.
	Secret bool
	Redact func(string) string
	// Check returns what is wrong with v, the field's value (of the
	// field's type), in c, which a check across settings reads the others
	// from; nil when nothing is. It is not run for an optional setting
	// left empty.
	Check func(v any, c *Config) error
	// Example is a value that passes the check: the docs show it, and the
	// tests fill a required setting they do not set with it. A required
	// setting has one.
	Example string
	// Help is one line for -h: the flag's usage, the flag's placeholder
	// in backquotes as package flag wants it.
	Help string
	// Doc is the docs page's text, Markdown on one line; Help when empty.
	Doc string
}

// ByRole is a Default that differs between the worker and the starter.
type ByRole struct{ Worker, Starter any }

// FlagGroup is a group of settings that a program may leave out with
// Omit, because it never uses them.
type FlagGroup int

// The groups Omit accepts.
const (
	// TemporalFlags are the TEMPORAL_* settings with their flags
	// --temporal-address, --temporal-namespace and --task-queue.
	TemporalFlags FlagGroup = iota + 1
	// MigrateFlag is MIGRATE_ON_START and its flag --migrate.
	MigrateFlag
)

// sdkReads opens the docs of the Temporal connection's settings, read by the SDK's envconfig.
const sdkReads = "read by the Temporal SDK's envconfig; "

// Settings is every setting of keyed's programs, in the order -h and the
// docs page list them.
var Settings = []Setting{
	{Env: "DATABASE_URL", Field: "Database.URL", For: InWorker | InStarter, Default: DefaultDatabaseURL, Secret: true,
		Redact: func(s string) string { return Database{URL: s}.Redacted() }, Check: postgresURL,
		Help: "Postgres connection string; add search_path=SCHEMA to use a schema",
		Doc: "Postgres; add `search_path=…` to put keyed's tables in a schema. Its password is never logged. " +
			"Without `pool_max_conns` the worker's pool holds 3 connections plus two per core for its activities, at least 4 and at most 16 " +
			"and no more than its activity slots (7 on two cores, 19 from eight); " +
			"a `pool_max_conns` below 4 is refused for the worker; the starter works on any pool, one connection included " +
			"(no request or command holds one while it waits for another)"},
	{Env: "MIGRATE_ON_START", Flag: "migrate", Field: "Database.Migrate", For: InWorker | InStarter, Group: MigrateFlag,
		Default: ByRole{Worker: true, Starter: false},
		Help:    "apply keyed's database migrations on start",
		Doc: "apply `migrations/` on start, under an advisory lock; run `starter migrate` from a deployment job instead when workers run with `false`. " +
			"With `false` the worker, `starter serve` and `starter relay` refuse to start (exit 2) on a schema without keyed's tables, and log the migrations still pending. Either way they log a warning, and start, on a schema a newer build migrated further"},
	{Env: "TEMPORAL_ADDRESS", Flag: "temporal-address", Field: "Temporal.Address", For: InWorker | InStarter, Group: TemporalFlags,
		Default: DefaultTemporalAddress, Check: hostPort,
		Help: "Temporal frontend `host:port`",
		Doc:  "Temporal frontend; for Temporal Cloud `<namespace>.<account>.tmprl.cloud:7233` (mTLS) or the regional endpoint (API key). Else the config file profile's `address`"},
	{Env: "TEMPORAL_NAMESPACE", Flag: "temporal-namespace", Field: "Temporal.Namespace", For: InWorker | InStarter, Group: TemporalFlags,
		Default: DefaultTemporalNamespace, Check: nonEmpty,
		Help: "Temporal `namespace`",
		Doc:  "namespace (`<namespace>.<account>` on Temporal Cloud); register `TenantID`, `OrderID` and `KeyedAttention` on it as Keyword search attributes first. Else the profile's `namespace`"},
	{Env: "TEMPORAL_TASK_QUEUE", Flag: "task-queue", Field: "Temporal.TaskQueue", For: InWorker | InStarter, Group: TemporalFlags,
		Default: orders.TaskQueue, Check: nonEmpty,
		Help: "Temporal task `queue` of the order workflow",
		Doc:  "task queue of the order workflow and its activities"},
	{Env: "TEMPORAL_GRPC_COMPRESSION", Field: "Temporal.Compression", For: InWorker | InStarter, Group: TemporalFlags,
		Default: DefaultGRPCCompression, Check: oneOf(CompressionGzip, CompressionNone),
		Help: "gRPC compression of the calls to Temporal: gzip or none",
		Doc: "`gzip` compresses every call to the frontend (the SDK's default, for links that are paid for or slow), at gzip's fastest level; " +
			"`none` sends them plain, which saves the worker the CPU of gzip (about 7% of it under load at that level, 10% at the default level) where the worker and the cluster share a network"},
	{Env: "RELAY_CONCURRENCY", Field: "Temporal.RelayConcurrency", For: InWorker | InServe, Default: outbox.DefaultConcurrency,
		Check: between(1, 1000),
		Help:  "most workflow starts one outbox relay has in flight",
		Doc: "the most workflow starts one outbox relay (in the worker, and in `starter serve` with `KEYED_SERVE_RELAY`) has in flight " +
			"(1 to 1000); each briefly needs a pooled connection to record its start, so a burst of API orders reaches Temporal this many at a time"},
	{Env: "TEMPORAL_API_KEY", For: InWorker | InStarter, Group: TemporalFlags, Secret: true,
		Help: "Temporal Cloud API key; turns TLS on",
		Doc:  sdkReads + "an API key, sent as `authorization: Bearer …` (with the regional endpoint as `TEMPORAL_ADDRESS`); turns TLS on"},
	{Env: "TEMPORAL_TLS", For: InWorker | InStarter, Group: TemporalFlags, DefaultDoc: "on when any TEMPORAL_TLS_* or the API key is set",
		Help: "true for TLS with the system roots alone, false for plain text",
		Doc:  sdkReads + "`true` for TLS with the system's roots and no other setting; `false` forces plain text, for a plain-text proxy"},
	{Env: "TEMPORAL_TLS_CLIENT_CERT_PATH", For: InWorker | InStarter, Group: TemporalFlags,
		Help: "mTLS client certificate, a PEM file; turns TLS on",
		Doc:  sdkReads + "the mTLS client certificate (PEM), with `TEMPORAL_TLS_CLIENT_KEY_PATH`: both or neither; turns TLS on"},
	{Env: "TEMPORAL_TLS_CLIENT_CERT_DATA", For: InWorker | InStarter, Group: TemporalFlags,
		Help: "the client certificate itself, PEM, instead of the file",
		Doc:  sdkReads + "the client certificate's PEM itself, instead of `TEMPORAL_TLS_CLIENT_CERT_PATH` (not both)"},
	{Env: "TEMPORAL_TLS_CLIENT_KEY_PATH", For: InWorker | InStarter, Group: TemporalFlags,
		Help: "the client certificate's private key, a PEM file",
		Doc:  sdkReads + "the client certificate's private key (PEM); an unreadable or mismatched key is named, never quoted"},
	{Env: "TEMPORAL_TLS_CLIENT_KEY_DATA", For: InWorker | InStarter, Group: TemporalFlags, Secret: true,
		Help: "the client key itself, PEM, instead of the file",
		Doc:  sdkReads + "the private key's PEM itself, instead of `TEMPORAL_TLS_CLIENT_KEY_PATH` (not both)"},
	{Env: "TEMPORAL_TLS_SERVER_CA_CERT_PATH", For: InWorker | InStarter, Group: TemporalFlags, DefaultDoc: "system roots",
		Help: "CA that signs the frontend's certificate, a PEM file",
		Doc:  sdkReads + "a private CA that signs the frontend's certificate (self-hosted clusters; Temporal Cloud needs none)"},
	{Env: "TEMPORAL_TLS_SERVER_CA_CERT_DATA", For: InWorker | InStarter, Group: TemporalFlags,
		Help: "the CA certificate itself, PEM, instead of the file",
		Doc:  sdkReads + "the CA's PEM itself, instead of `TEMPORAL_TLS_SERVER_CA_CERT_PATH` (not both)"},
	{Env: "TEMPORAL_TLS_SERVER_NAME", For: InWorker | InStarter, Group: TemporalFlags, DefaultDoc: "the address's host",
		Help: "name the frontend's certificate is verified against",
		Doc:  sdkReads + "the name to verify the frontend's certificate against (SNI), when it differs from the address's host"},
	{Env: "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION", For: InWorker | InStarter, Group: TemporalFlags, DefaultDoc: "false",
		Help: "skip verifying the frontend's certificate: never in production",
		Doc:  sdkReads + "skips verifying the frontend's certificate; never in production (the startup log shows `temporal_tls_verify=false`)"},
	{Env: "TEMPORAL_CLIENT_AUTHORITY", For: InWorker | InStarter, Group: TemporalFlags,
		Help: "the :authority of the gRPC calls, when a proxy needs it",
		Doc:  sdkReads + "overrides the `:authority` of the gRPC calls, for a proxy that routes by it"},
	{Env: "TEMPORAL_GRPC_META_*", For: InWorker | InStarter, Group: TemporalFlags,
		Help: "an extra gRPC header on every call",
		Doc:  sdkReads + "`TEMPORAL_GRPC_META_<NAME>` adds a gRPC header to every call (`NAME` lower-cased, `_` to `-`)"},
	{Env: "TEMPORAL_CONFIG_FILE", For: InWorker | InStarter, Group: TemporalFlags,
		DefaultDoc: "$XDG_CONFIG_HOME/temporalio/temporal.toml, if it exists",
		Help:       "the Temporal CLI's TOML config file of profiles",
		Doc: sdkReads + "the Temporal CLI's TOML file: `[profile.NAME]` with `address`, `namespace`, `api_key` and `[profile.NAME.tls]` " +
			"`client_cert_path`, `client_key_path`, `server_ca_cert_path`, `server_name`. The variables override a profile, and keyed's flags the variables"},
	{Env: "TEMPORAL_PROFILE", For: InWorker | InStarter, Group: TemporalFlags, DefaultDoc: `"default"`,
		Help: "the config file's profile to use",
		Doc:  sdkReads + "the profile to use; one the file lacks is a configuration error"},
	{Env: "LOG_LEVEL", Flag: "log-level", Field: "LogLevel", For: InWorker | InStarter,
		Default: ByRole{Worker: slog.LevelInfo, Starter: slog.LevelWarn},
		Help:    "minimum log `level`: debug, info, warn or error",
		Doc:     "`debug`, `info`, `warn` or `error`; the worker logs JSON to stdout, the starter text to stderr"},
	{Env: "OTEL_TRACES_EXPORTER", For: InWorker | InStarter, DefaultDoc: "off",
		Help: "otlp turns OpenTelemetry tracing on, none keeps it off",
		Doc:  "`otlp` turns tracing over OTLP/HTTP on; `none` (or `OTEL_SDK_DISABLED=true`) keeps it off whatever else is set; any other exporter is a start error (see deploy/README.md, \"Tracing\")"},
	{Env: "OTEL_EXPORTER_OTLP_ENDPOINT", For: InWorker | InStarter,
		Help: "the collector's OTLP/HTTP endpoint; turns tracing on",
		Doc:  "the collector's OTLP/HTTP (protobuf) endpoint, e.g. `http://otel-collector:4318`; setting it (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns tracing on when `OTEL_TRACES_EXPORTER` is unset"},
	{Env: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", For: InWorker | InStarter,
		Help: "the collector's endpoint for traces only",
		Doc:  "as `OTEL_EXPORTER_OTLP_ENDPOINT`, for traces only"},
	{Env: "OTEL_EXPORTER_OTLP_PROTOCOL", For: InWorker | InStarter, DefaultDoc: "http/protobuf",
		Help: "only http/protobuf is built in",
		Doc:  "only `http/protobuf` is built in: any other (such as `grpc`), here or in `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, is a start error"},
	{Env: "OTEL_SERVICE_NAME", For: InWorker | InStarter, DefaultDoc: "keyed",
		Help: "the service name on the spans",
		Doc:  "names the process on its spans; set `keyed-worker` and `keyed-api` in their Deployments"},
	{Env: "OTEL_*", For: InWorker | InStarter,
		Help: "the OpenTelemetry SDK's other standard variables",
		Doc:  "the OpenTelemetry SDK's other standard variables: `OTEL_SDK_DISABLED`, `OTEL_EXPORTER_OTLP_HEADERS` and the exporter's other settings, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`"},
	{Env: NotSettingsEnv, Field: "NotSettings", For: InWorker | InStarter,
		Help: "comma-separated variables of other programs that look like misspelled settings",
		Doc:  "names, comma-separated, the variables of other programs in a shared environment that look like a misspelled setting (such as a platform's `DATABASE_URI`), so that they are not refused as one"},
	{Env: "GOMEMLIMIT", For: InWorker | InStarter,
		Help: "the Go runtime's soft memory limit",
		Doc:  "the Go runtime's soft memory limit; the Kubernetes manifests set it from the container's memory limit"},

	{Env: "STRIPE_SECRET_KEY", Field: "Stripe.SecretKey", For: InWorker | InReconcile | InResolve, Required: InWorker | InReconcile,
		Secret: true, Check: stripeKey, Example: "sk_test_example",
		Help: "a Stripe secret key sk_… or restricted key rk_…; sk_test_… for test mode",
		Doc: "`sk_…` or a restricted `rk_…` key: the worker needs PaymentIntents and Refunds write and read, `reconcile` read; " +
			"`resolve` asks Stripe with it, when set, before it records a decision"},
	{Env: "STRIPE_API_BASE", Flag: "stripe-api-base", Field: "Stripe.APIBase", For: InWorker | InReconcile | InResolve,
		Default: DefaultStripeAPIBase, Check: baseURL,
		Help: "Stripe API base `URL`, e.g. a stripe-mock or fake",
		Doc:  "point at stripe-mock or the fake for tests; a URL with credentials is refused"},
	{Env: "STRIPE_CALLS_PER_SECOND", Flag: "stripe-calls-per-second", Field: "Stripe.CallsPerSecond", For: InWorker | InDoctor,
		Default: 0.0, Check: callRate,
		Help: "Stripe steps started per second across all workers; 0: unbounded",
		Doc: "bounds the Stripe steps (charges, refunds) started per second across all workers: they run on their own task queue " +
			"(`TEMPORAL_TASK_QUEUE` + `-stripe`) with Temporal's activity rate limit, which every worker sets when it polls it; " +
			"below Stripe's limit (live mode 100 requests/s, test mode 25), so that a burst queues in Temporal instead of meeting 429s. " +
			"`0` runs them on the worker's queue, unbounded; set it alike on every worker"},
	{Env: "SENDGRID_API_KEY", Field: "SendGrid.APIKey", For: InWorker | InResolve, Required: InWorker, Secret: true,
		Example: "SG.example", Help: "a SendGrid API key, SG.…",
		Doc: "a SendGrid API key with Mail Send (and Email Activity read, to settle lost answers); `resolve` looks messages up with it, when set"},
	{Env: "SENDGRID_API_BASE", Flag: "sendgrid-api-base", Field: "SendGrid.APIBase", For: InWorker | InResolve,
		Default: DefaultSendGridAPIBase, Check: baseURL,
		Help: "SendGrid API base `URL`",
		Doc:  "`https://api.eu.sendgrid.com` for EU data residency, or the fake"},
	{Env: "SENDGRID_CALLS_PER_SECOND", Flag: "sendgrid-calls-per-second", Field: "SendGrid.CallsPerSecond", For: InWorker | InDoctor,
		Default: 0.0, Check: callRate,
		Help: "SendGrid sends started per second across all workers; 0: unbounded",
		Doc:  "as `STRIPE_CALLS_PER_SECOND`, for the SendGrid steps (receipts, refund emails) on `TEMPORAL_TASK_QUEUE` + `-sendgrid`"},
	{Env: "SENDGRID_LOOKUP_LAG", Field: "SendGrid.LookupLag", For: InWorker, Default: notify.DefaultLookupLag, Check: positive,
		Help: "how long SendGrid's Email Activity index may lag a send",
		Doc:  "how long SendGrid's Email Activity index may lag a send: a retry that finds no message waits this long after the possible send before sending"},
	{Env: "SENDGRID_LOOKUP_GIVE_UP", Field: "SendGrid.LookupGiveUp", For: InWorker, Default: notify.DefaultLookupGiveUp, Check: positive,
		Help: "how much longer a failing look-up is retried",
		Doc:  "how much longer a failing look-up is retried before `RECEIPT_POLICY` decides"},
	{Env: "RECEIPT_FROM", Flag: "receipt-from", Field: "Receipt.From", For: InWorker | InResolve, Required: InWorker, Check: address,
		Example: "Receipts <receipts@example.com>", Help: "receipt sender `address`, such as receipts@example.com",
		Doc: "sender of receipts, `receipts@example.com` or `Name <receipts@example.com>`; a verified sender in SendGrid"},
	{Env: "RECEIPT_POLICY", Flag: "receipt-policy", Field: "Receipt.Policy", For: InWorker, Default: DefaultReceiptPolicy,
		Check: oneOf(AtMostOnce, AtLeastOnce),
		Help:  "receipt delivery `policy`: at_most_once or at_least_once",
		Doc: "what a receipt does when an earlier attempt's fate is unknown and SendGrid's Email Activity API cannot be asked for the whole look-up bound: " +
			"`at_most_once` fails as `ambiguous` for an operator, `at_least_once` sends again. Otherwise both settle it from SendGrid's record"},
	{Env: "COLLAPSE_WINDOW", Flag: "collapse-window", Field: "Receipt.CollapseWindow", For: InWorker, Default: DefaultCollapseWindow,
		Check: collapseWindow,
		Help:  "drop a repeat receipt to the same recipient for the same order within this `duration`",
		Doc:   "a repeat send to the same recipient, template and entity inside it is dropped; at least the provider timeout (30 s) plus `SENDGRID_LOOKUP_LAG`"},
	{Env: "METRICS_ADDR", Flag: "metrics-addr", Field: "Metrics.Addr", For: InWorker | InServe,
		Default: ByRole{Worker: DefaultMetricsAddr, Starter: DefaultServeMetricsAddr}, Check: hostPort,
		Help: "`host:port` serving /metrics and /healthz",
		Doc: "serves `/metrics` and `/healthz` (Postgres and Temporal); `0.0.0.0:9464` in a container (the image sets it). " +
			"`starter serve` serves them here, never on the API's port, so that no tenant sees another's request counts or keyed's internal names"},
	{Env: "WORKER_STOP_TIMEOUT", Flag: "stop-timeout", Field: "Worker.StopTimeout", For: InWorker, Default: DefaultStopTimeout, Check: positive,
		Help: "on SIGTERM, how long to wait for in-flight activities",
		Doc:  "on SIGTERM, how long in-flight activities may finish before their context is cancelled"},
	{Env: "WORKER_MAX_ACTIVITIES", Flag: "max-activities", Field: "Worker.MaxConcurrentActivities", For: InWorker | InDoctor,
		Default: DefaultMaxActivities, Check: between(1, MaxActivities),
		Help: "most activities one worker runs at once",
		Doc: fmt.Sprintf("concurrent activities per worker (1 to %d), and steps' first attempts in the workflow task beside them; "+
			"`doctor` sizes the worker's pool from it", MaxActivities)},
	{Env: "WORKER_TENANT_SHARE", Flag: "tenant-share", Field: "Worker.TenantShare", For: InWorker, Default: 0,
		DefaultDoc: "0 (56 of 64 slots)", Check: tenantShare,
		Help: "most activity slots of a worker one tenant may hold at once (0: all but an eighth of them)",
		Doc: "most of a worker's `WORKER_MAX_ACTIVITIES` slots (and of each provider queue's) one tenant's activities may hold at once; " +
			"`0` keeps an eighth back, at least one; `WORKER_MAX_ACTIVITIES` turns the limit off. An attempt over it returns at once and is retried " +
			"after about as long as that tenant's activities take (error type `KeyedOverShare`), so one tenant's slow provider calls leave slots " +
			"for the others; see docs/deployment.md, \"Fair to tenants\". The same share bounds a tenant's first attempts in the workflow task, " +
			"which over it go to the task queue at once (`KeyedNotLocal`)"},
	{Env: "WORKER_POLLERS", Flag: "pollers", Field: "Worker.Pollers", For: InWorker, Default: DefaultPollers, Check: between(2, 64),
		Help: "activity-task pollers, and the most workflow-task pollers of the task queue and of the sticky queue, each",
		Doc: "activity-task pollers (2 to 64), and the most workflow-task pollers of the task queue and of the sticky queue, each " +
			"(half each at first, never fewer than one on each queue); the SDK's default of 2 starves workflow tasks on a busy queue"},
	{Env: "DECISION_TIMEOUT", Flag: "decision-timeout", Field: "Worker.DecisionTimeout", For: InWorker | InDoctor,
		Default: DefaultDecisionTimeout, Check: atLeast(time.Minute, "is under a minute; an operator needs time to look"),
		Help: "how long a run waits for an operator's decision before it fails",
		Doc:  "how long an order or refund run waits for an operator's decision on an outcome keyed cannot know before it fails with `DecisionTimeout`; applies to waits that begin after a change"},
	{Env: "EFFECTS_RETENTION", Flag: "effects-retention", Field: "Worker.EffectsRetention", For: InWorker | InDoctor,
		Default: DefaultEffectsRetention, Check: atLeast(time.Hour, "is under one hour; effect records must outlive the retry window"),
		Help: "prune finished effect records older than this",
		Doc:  "finished effect records older than this are pruned; the worker refuses one shorter than the namespace's retention plus the longest run (2 h of retries plus `DECISION_TIMEOUT`), and `doctor` judges it likewise"},
	{Env: "MONEY_RETENTION", Flag: "money-retention", Field: "Worker.MoneyRetention", For: InWorker | InDoctor,
		Default: DefaultMoneyRetention, Check: atLeast(time.Hour, "is under one hour; effect records must outlive the retry window"),
		Help: "keep charge and refund effect records this long",
		Doc:  "charge and refund records (steps declared with `step.KeepMoney`) are kept at least this long, for disputes; the worker refuses one shorter than `EFFECTS_RETENTION`"},
	{Env: "EFFECTS_LEAVES_PER_LIFETIME", Flag: "effects-leaves-per-lifetime", Field: "Worker.LeavesPerLifetime", For: InWorker,
		Default: effects.LeavesPerLifetime, Check: between(1, effects.MaxLeavesPerLifetime),
		Help: "how many leaves (partitions) each kind's effect records are kept in over their lifetime",
		Doc: "each kind's lifetime is cut into this many leaves (1 to 16, at least a day wide each): more makes what each retention `DROP` frees smaller " +
			"and costs each claim one more leaf to look in; see docs/operating.md, \"Sizing leaves\""},
	{Env: "PRUNE_EVERY", Field: "Worker.PruneEvery", For: InWorker, Default: DefaultPruneEvery, Check: atLeast(time.Minute, "is under one minute"),
		Help: "prune once per window of this length, across replicas",
		Doc:  "each window of this length is pruned once across all replicas"},
	{Env: "RECONCILE_EVERY", Field: "Worker.ReconcileEvery", For: InWorker, Default: DefaultReconcileEvery, Check: offOrAtLeast(time.Minute, "is under one minute"),
		Help: "reconcile with Stripe once per window of this length, across replicas (0: off)",
		Doc:  "once per window of this length, across all replicas, the worker compares the charge and refund records of the window before (and an hour more) with Stripe and exports the findings as `keyed_reconcile_findings{kind}`; `0` turns it off (run `starter reconcile` yourself)"},
	{Env: "SETTLE_EVERY", Field: "Worker.SettleEvery", For: InWorker, Default: DefaultSettleEvery, Check: atLeast(time.Second, "is under one second"),
		Help: "settle waiting runs from provider evidence once per window of this length, across replicas",
		Doc:  "once per window of this length, across all replicas, the worker asks the providers about every run waiting for a decision and decides what their evidence settles (`by: keyed`); see docs/operating.md"},

	{Env: "KEYED_API_ADDR", Flag: "addr", Field: "API.Addr", For: InServe, Default: DefaultAPIAddr, Check: hostPort,
		Help: "listen `host:port`",
		Doc:  "the HTTP API's listen address; `0.0.0.0:8080` in a container"},
	{Env: "KEYED_SERVE_RELAY", Flag: "relay", Field: "API.Relay", For: InServe, Default: false,
		Help: "also run an outbox relay in this process",
		Doc:  "also run an outbox relay in the API process (the worker always runs one); the API uses the Temporal settings for it and for `Prefer: wait`"},
	{Env: "KEYED_API_KEYS", Field: "API.Keys", For: InServe, Secret: true,
		Help: "the API keys, tenant=key,…",
		Doc: "`acme=sk_…,globex=sk_…`: one bearer key per tenant, at least 16 bytes of letters, digits and `-._~+/` (then `=` padding), entries separated by commas; no two tenants may differ only in case; the tenant comes from the key, and must leave room for its effect keys, " +
			"an Idempotency-Key's the longest (at most 171 bytes, `api.MaxTenantLen`). This or `KEYED_API_KEYS_FILE` is required"},
	{Env: "KEYED_API_KEYS_FILE", Field: "API.KeysFile", For: InServe,
		Help: "a file with one tenant=key a line, instead of KEYED_API_KEYS",
		Doc:  "a file with one `tenant=key` a line (blank lines and `#` comments ignored), instead of `KEYED_API_KEYS`; not both"},
	{Env: "KEYED_API_RATE_LIMIT", Field: "API.RateLimit.Rate", For: InServe, Default: DefaultAPIRateLimit, Check: rate,
		Help: "requests a second each tenant may send, sustained; 0 turns the limit off",
		Doc: "requests a second each tenant may send to one API process, sustained (a token bucket per tenant, over every `/v1` route); " +
			"over it a request gets `429 rate_limited` with `Retry-After` and writes nothing. N replicas let a tenant send N times as much. `0` turns the limit off"},
	{Env: "KEYED_API_RATE_BURST", Field: "API.RateLimit.Burst", For: InServe, Default: DefaultAPIRateBurst, Check: burst,
		Help: "requests a tenant may send at once after a quiet spell",
		Doc:  "how many requests a tenant may send at once after a quiet spell; at least 1 while the limit is on"},

	{Env: "KEYED_API_MAX_CONNECTIONS", Field: "API.MaxConns", For: InServe, Default: 0,
		DefaultDoc: "0 (¾ of the open-file limit, at most 10 000)", Check: maxConns,
		Help: "the most connections the API holds open (0: three quarters of the open-file limit, 64 to 10000)",
		Doc: "the most client connections one API process holds open; at the cap a new connection closes the one idle longest between requests, " +
			"else a new one that has sent no complete request headers within its grace (a second, or half the header timeout if shorter), else waits in the kernel's backlog until one ends, " +
			"so that callers never take the file descriptors of its Postgres and Temporal connections. " +
			"`0` is three quarters of the process's open-file limit, at least 64 and at most 10 000 (`api.DefaultMaxConns`); otherwise at least 16"},

	{Env: "KEYED_API_MAX_WAIT", Field: "API.MaxWait", For: InServe, Default: DefaultAPIMaxWait, Check: maxWait,
		Help: "the longest Prefer: wait a POST may wait for its outcome; 0 ignores the preference",
		Doc: "the longest a `POST /v1/orders` or refund with `Prefer: wait=N` waits for the charge (or refund) to settle before it answers `202`; " +
			"under 20 s, so that the 30 s Idempotency-Key lease outlasts the request. `0` ignores the preference"},

	{Env: "KEYED_TEMPORAL_BIN", For: InTests, DefaultDoc: "bin/temporal",
		Help: "the Temporal CLI that runs the dev server",
		Doc:  "the Temporal CLI the tests and `make demo` run the dev server with; `make tools` builds it"},
	{Env: "KEYED_STRIPE_MOCK_BIN", For: InTests, DefaultDoc: "bin/stripe-mock",
		Help: "the stripe-mock binary",
		Doc:  "the stripe-mock binary the fakes' conformance tests run; `make tools` builds it"},
	{Env: "KEYED_PG_BINDIR", For: InTests, DefaultDoc: "the newest /usr/lib/postgresql/*/bin",
		Help: "PostgreSQL's server binaries for the tests' own clusters",
		Doc:  "where the tests that start their own PostgreSQL cluster find `initdb` and `postgres`"},
}

// NotSettingsEnv names the variables of other programs that the
// misspelling check lets through, comma-separated.
const NotSettingsEnv = "KEYED_NOT_SETTINGS"

// The checks rows use. Each returns what is wrong with v, the field's
// value, without naming the setting.

func postgresURL(v any, _ *Config) error {
	if _, err := pgxpool.ParseConfig(v.(string)); err != nil {
		return fmt.Errorf("not a Postgres connection string: %s (want postgres://user[:password]@host:5432/db?sslmode=disable)",
			connStringProblem(err))
	}
	return nil
}

// connStringHints adds what to check to some of pgx's phrases.
var connStringHints = map[string]string{
	"failed to parse as URL":  "; a password with / ? # @ : or % in it needs them percent-encoded",
	"failed to configure TLS": ": check sslmode (disable, allow, prefer, require, verify-ca or verify-full) and the files sslrootcert, sslcert and sslkey name",
}

// connStringProblem says what pgx found wrong with a connection string,
// without the string: pgx's message quotes it (its redaction of the
// password is best effort, it says so itself) and wraps errors, such as
// net/url's, that quote it whole. Only pgx's own phrase is kept.
func connStringProblem(err error) string {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return "it could not be parsed"
	}
	full := pce.Error()
	if inner := pce.Unwrap(); inner != nil {
		full = strings.TrimSuffix(full, " ("+inner.Error()+")")
	}
	at := strings.LastIndex(full, "`: ")
	if at < 0 {
		return "it could not be parsed"
	}
	phrase := full[at+len("`: "):]
	return phrase + connStringHints[phrase]
}

func hostPort(v any, _ *Config) error { return checkHostPort(v.(string)) }

func baseURL(v any, _ *Config) error { return checkBaseURL(v.(string)) }

func nonEmpty(v any, _ *Config) error {
	if v.(string) == "" {
		return fmt.Errorf("must not be empty")
	}
	return nil
}

func stripeKey(v any, _ *Config) error {
	if k := string(v.(Secret)); !strings.HasPrefix(k, "sk_") && !strings.HasPrefix(k, "rk_") {
		return fmt.Errorf("must start with sk_ or rk_ (is it a publishable pk_ key?)")
	}
	return nil
}

func address(v any, _ *Config) error {
	if _, err := mail.ParseAddress(v.(string)); err != nil {
		return fmt.Errorf("%q is not an email address", v)
	}
	return nil
}

func oneOf(allowed ...string) func(any, *Config) error {
	return func(v any, _ *Config) error {
		for _, a := range allowed {
			if v.(string) == a {
				return nil
			}
		}
		return fmt.Errorf("%q is not %s", v, strings.Join(allowed, " or "))
	}
}

// maxWait accepts 0 (off) up to under 20 s: the request lease (30 s) must
// exceed twice the request timeout (5 s) plus the wait.
func maxWait(v any, _ *Config) error {
	if d := v.(time.Duration); d < 0 || d >= 20*time.Second {
		return fmt.Errorf("%s is not between 0 and 20s", d)
	}
	return nil
}

// maxConns accepts 0 (three quarters of the open-file limit) or a cap of
// at least 16 connections.
func maxConns(v any, _ *Config) error {
	if n := v.(int); n != 0 && n < 16 {
		return fmt.Errorf("%d must be 0 (three quarters of the open-file limit) or at least 16", n)
	}
	return nil
}

func positive(v any, _ *Config) error {
	switch n := v.(type) {
	case time.Duration:
		if n <= 0 {
			return fmt.Errorf("%s must be positive", n)
		}
	case int:
		if n <= 0 {
			return fmt.Errorf("%d must be positive", n)
		}
	}
	return nil
}

// tenantShare accepts 0 (the default share) up to WORKER_MAX_ACTIVITIES.
func tenantShare(v any, c *Config) error {
	if n, slots := v.(int), c.Worker.MaxConcurrentActivities; n < 0 || n > slots {
		return fmt.Errorf("%d is not between 0 and WORKER_MAX_ACTIVITIES (%d)", n, slots)
	}
	return nil
}

func between(lo, hi int) func(any, *Config) error {
	return func(v any, _ *Config) error {
		if n := v.(int); n < lo || n > hi {
			return fmt.Errorf("%d is not between %d and %d", n, lo, hi)
		}
		return nil
	}
}

// atLeast refuses a duration under least, saying why.
func atLeast(least time.Duration, why string) func(any, *Config) error {
	return func(v any, _ *Config) error {
		if d := v.(time.Duration); d < least {
			return fmt.Errorf("%s %s", d, why)
		}
		return nil
	}
}

// offOrAtLeast is atLeast, with 0 meaning off.
func offOrAtLeast(least time.Duration, why string) func(any, *Config) error {
	check := atLeast(least, why)
	return func(v any, c *Config) error {
		if v.(time.Duration) == 0 {
			return nil
		}
		return check(v, c)
	}
}

// collapseWindow: the window's rows date a possible send while SendGrid's
// index catches up, so it must cover the send's timeout and the lag.
func collapseWindow(v any, c *Config) error {
	if least := ProviderTimeout + c.SendGrid.LookupLag; v.(time.Duration) < least {
		return fmt.Errorf("%s is shorter than the provider timeout plus SENDGRID_LOOKUP_LAG (%s): "+
			"its rows date a possible send while SendGrid's index catches up", v, least)
	}
	return nil
}

func rate(v any, _ *Config) error {
	if r := v.(float64); r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		return fmt.Errorf("%v must be a number of requests a second, at least 0 (0 turns the limit off)", r)
	}
	return nil
}

func callRate(v any, _ *Config) error {
	if r := v.(float64); r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		return fmt.Errorf("%v must be a number of calls a second, at least 0 (0: unbounded)", r)
	}
	return nil
}

func burst(v any, c *Config) error {
	if r := c.API.RateLimit.Rate; r > 0 && !math.IsInf(r, 0) && v.(int) < 1 {
		return fmt.Errorf("%d must be at least 1 while KEYED_API_RATE_LIMIT is on", v)
	}
	return nil
}

// RequiredExamples returns, for every setting that programs of u require,
// its Example by variable: what a demo or a test sets when it has nothing
// better, so that a new required setting (a new provider's key) breaks
// neither.
func RequiredExamples(u Uses) map[string]string {
	m := map[string]string{}
	for _, s := range Settings {
		if s.Required&u != 0 {
			m[s.Env] = s.Example
		}
	}
	return m
}
