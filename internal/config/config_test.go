package config_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
)

const (
	stripeKey   = "sk_test_51SECRETSECRETSECRET"
	sendgridKey = "SG.topsecret.value"
	dbPassword  = "hunter2-db-pass"
)

// env looks up m. Unless m names one, TEMPORAL_CONFIG_FILE is a file that
// does not exist, so that a Temporal CLI profile in the user's config
// directory cannot change the results.
func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		if !ok && k == "TEMPORAL_CONFIG_FILE" {
			return filepath.Join(os.TempDir(), "keyed-config-test-no-temporal.toml"), true
		}
		return v, ok
	}
}

// workerEnv is what the worker requires, with secrets the tests look for.
func workerEnv() map[string]string {
	m := fxapptest.Required(config.InWorker)
	m["STRIPE_SECRET_KEY"], m["SENDGRID_API_KEY"] = stripeKey, sendgridKey
	return m
}

func load(t *testing.T, role config.Role, m map[string]string, args ...string) (*config.Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return config.Load(role, fs, args, env(m))
}

func TestWorkerDefaults(t *testing.T) {
	t.Parallel()
	c, err := load(t, config.Worker, workerEnv())
	require.NoError(t, err)
	require.Equal(t, config.DefaultDatabaseURL, c.Database.URL)
	require.True(t, c.Database.Migrate)
	require.Equal(t, "127.0.0.1:7233", c.Temporal.Address)
	require.Equal(t, "default", c.Temporal.Namespace)
	require.Equal(t, orders.TaskQueue, c.Temporal.TaskQueue)
	require.Equal(t, "https://api.stripe.com", c.Stripe.APIBase)
	require.Equal(t, "https://api.sendgrid.com", c.SendGrid.APIBase)
	require.Equal(t, "127.0.0.1:9464", c.Metrics.Addr)
	require.Equal(t, config.AtMostOnce, c.Receipt.Policy)
	require.Equal(t, 10*time.Minute, c.Receipt.CollapseWindow)
	require.Equal(t, 30*time.Second, c.Worker.StopTimeout)
	require.Equal(t, slog.LevelInfo, c.LogLevel)
}

func TestStarterNeedsNoProviderKeys(t *testing.T) {
	t.Parallel()
	c, err := load(t, config.Starter, map[string]string{"TEMPORAL_NAMESPACE": "orders"})
	require.NoError(t, err)
	require.False(t, c.Database.Migrate)
	require.Equal(t, "orders", c.Temporal.Namespace)
	require.Empty(t, c.Stripe.SecretKey)
}

func TestFlagsOverrideEnvironment(t *testing.T) {
	t.Parallel()
	m := workerEnv()
	m["TEMPORAL_ADDRESS"] = "temporal:7233"
	m["COLLAPSE_WINDOW"] = "5m"
	c, err := load(t, config.Worker, m, "--temporal-address", "10.0.0.1:7233", "--collapse-window", "20m", "--receipt-policy", "at_least_once")
	require.NoError(t, err)
	require.Equal(t, "10.0.0.1:7233", c.Temporal.Address)
	require.Equal(t, 20*time.Minute, c.Receipt.CollapseWindow)
	require.Equal(t, config.AtLeastOnce, c.Receipt.Policy)
}

func TestSecretsHaveNoFlags(t *testing.T) {
	t.Parallel()
	_, err := load(t, config.Worker, workerEnv(), "--stripe-secret-key", "sk_x")
	require.Error(t, err)
	_, err = load(t, config.Worker, workerEnv(), "--database-url", "postgres://x")
	require.Error(t, err)
}

func TestAllProblemsInOneError(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"DATABASE_URL":      "postgres://u:" + dbPassword + "@host:notaport/db",
		"TEMPORAL_ADDRESS":  "no-port",
		"STRIPE_SECRET_KEY": "pk_live_" + dbPassword,
		"STRIPE_API_BASE":   "ftp://stripe",
		"SENDGRID_API_BASE": "not a url",
		"RECEIPT_FROM":      "not-an-address",
		"RECEIPT_POLICY":    "exactly_once",
		"COLLAPSE_WINDOW":   "ten minutes",
		"METRICS_ADDR":      ":99999",
		"LOG_LEVEL":         "loud",
	}
	_, err := load(t, config.Worker, bad)
	require.ErrorIs(t, err, config.ErrInvalid)
	var cerr *config.Error
	require.True(t, errors.As(err, &cerr))
	msg := err.Error()
	want := fxapptest.Required(config.InWorker) // each bad value, and each required setting left out
	for name := range bad {
		want[name] = bad[name]
	}
	for name := range want {
		require.Contains(t, msg, name, "the error names %s", name)
	}
	require.Len(t, cerr.Problems, len(want))
	require.NotContains(t, msg, dbPassword, "the error never holds a secret")
}

// A bad DATABASE_URL gets pgx's reason, never the string: not the password
// in the userinfo, nor one whose unencoded '/' cut the URL in two.
func TestDatabaseURLProblemNamesTheReasonNotTheSecret(t *testing.T) {
	t.Parallel()
	for url, reason := range map[string]string{
		"postgres://u:" + dbPassword + "@host:notaport/db":            "invalid port",
		"postgres://u:ab/" + dbPassword + "@host/db":                  "invalid port",
		"postgres://u:ab%zz" + dbPassword + "@host/db":                "failed to parse as URL; a password",
		"postgres://u:" + dbPassword + "@host/db?sslmode=sometimes":   "failed to configure TLS: check sslmode",
		"postgres://u:" + dbPassword + "@host/db?pool_max_conns=lots": "cannot parse pool_max_conns",
		"host=db password=" + dbPassword + " port=x":                  "invalid port",
		"host=db password='" + dbPassword + "' connect_timeout=soon":  "invalid connect_timeout",
	} {
		env := workerEnv()
		env["DATABASE_URL"] = url
		_, err := load(t, config.Worker, env)
		require.ErrorIs(t, err, config.ErrInvalid, url)
		require.Contains(t, err.Error(), "DATABASE_URL", url)
		require.Contains(t, err.Error(), reason, url)
		require.NotContains(t, err.Error(), dbPassword, url)
		require.NotContains(t, err.Error(), "ab/", url)
	}
}

func TestMissingWorkerSecrets(t *testing.T) {
	t.Parallel()
	_, err := load(t, config.Worker, nil)
	require.Error(t, err)
	var cerr *config.Error
	require.True(t, errors.As(err, &cerr))
	want := fxapptest.Required(config.InWorker)
	require.Len(t, cerr.Problems, len(want))
	for _, p := range cerr.Problems {
		name, _, _ := strings.Cut(p, ":")
		name, _, _ = strings.Cut(name, " (")
		require.Contains(t, want, name)
		require.Contains(t, p, ": required (")
	}
}

func TestRestrictedKeyAccepted(t *testing.T) {
	t.Parallel()
	m := workerEnv()
	m["STRIPE_SECRET_KEY"] = "rk_live_abc"
	_, err := load(t, config.Worker, m)
	require.NoError(t, err)
}

func TestRedaction(t *testing.T) {
	t.Parallel()
	m := workerEnv()
	m["DATABASE_URL"] = "postgres://keyed:" + dbPassword + "@db.internal:5433/keyed?sslmode=require&search_path=app"
	c, err := load(t, config.Worker, m)
	require.NoError(t, err)

	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("config", "config", c)
	for _, s := range []string{
		c.String(), fmt.Sprint(c), fmt.Sprintf("%+v", *c), fmt.Sprintf("%#v", *c),
		fmt.Sprint(c.Stripe), fmt.Sprint(c.SendGrid), fmt.Sprint(c.Database), logs.String(),
	} {
		require.NotContains(t, s, dbPassword)
		require.NotContains(t, s, "SECRETSECRET")
		require.NotContains(t, s, "topsecret")
	}
	require.Contains(t, c.String(), "postgres://keyed@db.internal:5433/keyed?search_path=app")
	require.Contains(t, c.String(), "stripe_secret_key=sk_test_…(redacted)")
	require.Contains(t, logs.String(), `"sendgrid_api_key":"SG.…(redacted)"`)
}

func TestBadFlagAndExtraArguments(t *testing.T) {
	t.Parallel()
	_, err := load(t, config.Worker, workerEnv(), "--collapse-window", "soon")
	require.Error(t, err)
	_, err = load(t, config.Worker, workerEnv(), "extra")
	require.ErrorContains(t, err, "unexpected arguments: extra")
	_, err = load(t, config.Worker, workerEnv(), "-h")
	require.ErrorIs(t, err, flag.ErrHelp)
}

func TestLoaderWithProgramFlags(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("create", flag.ContinueOnError)
	tenant := fs.String("tenant", "", "")
	l := config.NewLoader(config.Starter, env(map[string]string{"TEMPORAL_TASK_QUEUE": "q"}))
	l.BindFlags(fs)
	require.NoError(t, fs.Parse([]string{"--tenant", "acme", "--task-queue", "other"}))
	c, err := l.Load()
	require.NoError(t, err)
	require.Equal(t, "acme", *tenant)
	require.Equal(t, "other", c.Temporal.TaskQueue)
	require.False(t, strings.Contains(c.String(), "stripe"), "the starter's summary leaves out worker settings")
}

func TestFlagOverridesABadVariable(t *testing.T) {
	t.Parallel()
	m := workerEnv()
	m["COLLAPSE_WINDOW"] = "ten minutes"
	_, err := load(t, config.Worker, m)
	require.ErrorContains(t, err, "COLLAPSE_WINDOW")
	c, err := load(t, config.Worker, m, "--collapse-window", "12m")
	require.NoError(t, err)
	require.Equal(t, 12*time.Minute, c.Receipt.CollapseWindow)
}

func TestLookupSettingsAndTheCollapseWindow(t *testing.T) {
	t.Parallel()
	m := workerEnv()
	m["SENDGRID_LOOKUP_LAG"] = "10s"
	m["SENDGRID_LOOKUP_GIVE_UP"] = "20s"
	m["COLLAPSE_WINDOW"] = "1m"
	c, err := load(t, config.Worker, m)
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, c.SendGrid.LookupLag)
	require.Equal(t, 20*time.Second, c.SendGrid.LookupGiveUp)

	m["SENDGRID_LOOKUP_LAG"] = "5m"
	m["SENDGRID_LOOKUP_GIVE_UP"] = "0s"
	m["WORKER_POLLERS"] = "1"
	_, err = load(t, config.Worker, m)
	require.ErrorContains(t, err, "COLLAPSE_WINDOW (--collapse-window): 1m0s is shorter than the provider timeout plus SENDGRID_LOOKUP_LAG (5m30s)")
	require.ErrorContains(t, err, "SENDGRID_LOOKUP_GIVE_UP: 0s must be positive")
	require.ErrorContains(t, err, "WORKER_POLLERS (--pollers): 1 is not between 2 and 64")
}

func TestWorkerSlotsAndTheTenantShare(t *testing.T) {
	t.Parallel()
	m := workerEnv()
	c, err := load(t, config.Worker, m)
	require.NoError(t, err)
	require.Equal(t, 0, c.Worker.TenantShare, "0: the default share")
	m["WORKER_MAX_ACTIVITIES"] = "8"
	m["WORKER_TENANT_SHARE"] = "8"
	c, err = load(t, config.Worker, m)
	require.NoError(t, err)
	require.Equal(t, 8, c.Worker.TenantShare, "the whole worker: the limit off")

	m["WORKER_TENANT_SHARE"] = "9"
	_, err = load(t, config.Worker, m)
	require.ErrorContains(t, err, "WORKER_TENANT_SHARE (--tenant-share): 9 is not between 0 and WORKER_MAX_ACTIVITIES (8)")
	m["WORKER_TENANT_SHARE"] = "-1"
	m["WORKER_MAX_ACTIVITIES"] = "2000000000"
	_, err = load(t, config.Worker, m)
	require.ErrorContains(t, err, "WORKER_MAX_ACTIVITIES (--max-activities): 2000000000 is not between 1 and 4096")
	require.ErrorContains(t, err, "WORKER_TENANT_SHARE (--tenant-share): -1 is not between 0")
}

func TestURLCredentialsAreNeverEchoed(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t"
	m := workerEnv()
	m["STRIPE_API_BASE"] = "ftp://user:" + secret + "@x"
	m["SENDGRID_API_BASE"] = "https://user:" + secret + "@api.sendgrid.com/%zz"
	m["TEMPORAL_ADDRESS"] = "user:" + secret + "@temporal:7233"
	m["METRICS_ADDR"] = "user:" + secret + "@:9464"
	_, err := load(t, config.Worker, m)
	require.ErrorIs(t, err, config.ErrInvalid)
	var cerr *config.Error
	require.ErrorAs(t, err, &cerr)
	require.Len(t, cerr.Problems, 4, err.Error())
	for _, name := range []string{"STRIPE_API_BASE", "SENDGRID_API_BASE", "TEMPORAL_ADDRESS", "METRICS_ADDR"} {
		require.Contains(t, err.Error(), name)
	}
	require.NotContains(t, err.Error(), secret)
	require.Contains(t, err.Error(), `"ftp://x" carries credentials`)

	m = workerEnv()
	m["STRIPE_API_BASE"] = "https://user:" + secret + "@api.stripe.com"
	_, err = load(t, config.Worker, m)
	require.ErrorContains(t, err, "STRIPE_API_BASE")
	require.NotContains(t, err.Error(), secret, "credentials are refused even with a good scheme")
}

func TestBooleansAreStrict(t *testing.T) {
	t.Parallel()
	_, err := load(t, config.Starter, map[string]string{"MIGRATE_ON_START": "perhaps"})
	require.ErrorContains(t, err, `MIGRATE_ON_START (--migrate): "perhaps" is not true or false`)

	serve := func(v string, args ...string) (*config.Config, error) {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		l := config.NewLoader(config.Starter, env(map[string]string{"KEYED_SERVE_RELAY": v}))
		l.Command("serve")
		l.BindFlags(fs)
		require.NoError(t, fs.Parse(args))
		return l.Load()
	}
	_, err = serve("perhaps")
	require.ErrorContains(t, err, `KEYED_SERVE_RELAY (--relay): "perhaps" is not true or false`)
	c, err := serve("perhaps", "--relay")
	require.NoError(t, err, "the flag overrides the bad variable")
	require.True(t, c.API.Relay)
	c, err = serve("1")
	require.NoError(t, err)
	require.True(t, c.API.Relay)
}

func TestProblemsAndOmittedGroups(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l := config.NewLoader(config.Starter, env(map[string]string{"TEMPORAL_ADDRESS": "nope", "LOG_LEVEL": "loud", "MIGRATE_ON_START": "1"}))
	l.Omit(config.TemporalFlags, config.MigrateFlag)
	l.BindFlags(fs)
	for _, name := range []string{"temporal-address", "temporal-namespace", "task-queue", "migrate"} {
		require.Nil(t, fs.Lookup(name), name)
	}
	require.NotNil(t, fs.Lookup("log-level"))
	require.NoError(t, fs.Parse(nil))
	l.Problem("KEYED_API_KEYS", "entry 1: want tenant=key")
	_, err := l.Load()
	var cerr *config.Error
	require.ErrorAs(t, err, &cerr)
	require.Equal(t, []string{"KEYED_API_KEYS: entry 1: want tenant=key", `LOG_LEVEL (--log-level): "loud" is not debug, info, warn or error`}, cerr.Problems,
		"an omitted group is not checked; an added problem is listed with the others")
}

func TestPrintFlags(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.String("temporal-namespace", "default", "Temporal `namespace`")
	fs.String("as", "", "the `outcome`: done or retry (required)")
	fs.Bool("json", false, "print JSON")
	fs.Duration("wait", time.Second, "how long to `wait`")
	var b strings.Builder
	config.PrintFlags(&b, fs)
	require.Equal(t, "  --as outcome\n    \tthe outcome: done or retry (required)\n"+
		"  --json\n    \tprint JSON\n"+
		"  --temporal-namespace namespace\n    \tTemporal namespace (default \"default\")\n"+
		"  --wait wait\n    \thow long to wait (default 1s)\n", b.String())
}
