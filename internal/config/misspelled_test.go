package config_test

import (
	"flag"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
)

// A variable a letter or two from a setting, with the setting's first
// word or that word misspelled, is taken for the setting misspelled.
func TestMisspelledNamesTheSettingMeant(t *testing.T) {
	t.Parallel()
	require.Equal(t, map[string]string{
		"WORKER_MAX_ACTIVITES":    "WORKER_MAX_ACTIVITIES", // a letter left out
		"MIGRATE_ON_STRAT":        "MIGRATE_ON_START",      // two swapped
		"RECIEPT_POLICY":          "RECEIPT_POLICY",        // in the first word
		"STRIPE_SECRET_KEYS":      "STRIPE_SECRET_KEY",     // a secret's name; never its value
		"TEMPORAL_NAME_SPACE":     "TEMPORAL_NAMESPACE",
		"EFFECTS_RETENTOIN":       "EFFECTS_RETENTION",
		"KEYED_API_RATE_LIMTS":    "KEYED_API_RATE_LIMIT",
		"GOMEMLIMT":               "GOMEMLIMIT",
		"TEMPORAL_TLS_SEVER_NAME": "TEMPORAL_TLS_SERVER_NAME",
	}, config.Misspelled([]string{"WORKER_MAX_ACTIVITES", "MIGRATE_ON_STRAT", "RECIEPT_POLICY", "STRIPE_SECRET_KEYS",
		"TEMPORAL_NAME_SPACE", "EFFECTS_RETENTOIN", "KEYED_API_RATE_LIMTS", "GOMEMLIMT", "TEMPORAL_TLS_SEVER_NAME"}))
}

// Settings, their families and other programs' variables are never taken
// for misspellings: the system's, Postgres's, Go's, Kubernetes's service
// links for keyed's Services, and every variable keyed's own deploy files,
// Makefile, demo, scripts, tests and manuals name.
func TestMisspelledLeavesOtherVariablesAlone(t *testing.T) {
	t.Parallel()
	var names []string
	for _, s := range config.Settings {
		if family, ok := strings.CutSuffix(s.Env, "*"); ok {
			names = append(names, family+"ANY_NAME")
		} else {
			names = append(names, s.Env)
		}
	}
	names = append(names, "PATH", "HOME", "USER", "SHELL", "HOSTNAME", "TMPDIR", "LANG", "TERM", "TZ",
		"PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE", "PGSSLMODE", "PGAPPNAME",
		"GOFLAGS", "GOMAXPROCS", "GOGC", "GODEBUG", "GOPATH", "GOROOT", "GOCACHE", "GOTOOLCHAIN", "CGO_ENABLED",
		"OTEL_SERVICE_NAM", "OTEL_EXPORTER_OTLP_INSECURE", "TEMPORAL_GRPC_META_X_TENANT", "TEMPORAL_CLI_ADDRESS",
		"TEMPORAL_DEBUG", "XDG_CONFIG_HOME", "DATABASE_HOST", "DATABASE_PASSWORD", "STRIPE_API_KEY", "STRIPE_PUBLISHABLE_KEY")
	for _, svc := range []string{"KEYED_API", "KEYED_WORKER", "KEYED", "TEMPORAL", "TEMPORAL_FRONTEND", "POSTGRES", "OTEL_COLLECTOR"} {
		for _, suffix := range []string{"_SERVICE_HOST", "_SERVICE_PORT", "_SERVICE_PORT_HTTP", "_SERVICE_PORT_METRICS", "_SERVICE_PORT_GRPC",
			"_PORT", "_PORT_8080_TCP", "_PORT_8080_TCP_ADDR", "_PORT_8080_TCP_PORT", "_PORT_8080_TCP_PROTO", "_PORT_9464_TCP", "_PORT_7233_TCP"} {
			names = append(names, svc+suffix)
		}
	}
	names = append(names, repoVariables(t)...)
	require.Empty(t, config.Misspelled(names))
}

// repoVariables returns every name spelled like a variable in keyed's
// deploy files, Makefile, demo, fakes, scripts, tests and manuals (but the
// generated page, which shows a misspelling).
func repoVariables(t *testing.T) []string {
	t.Helper()
	name := regexp.MustCompile(`\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b`)
	seen := map[string]bool{}
	for _, root := range []string{"deploy", "Makefile", "cmd/demo", "cmd/fakes", "cmd/cluster", "scripts", "tests", ".ci", "docs", "README.md"} {
		err := filepath.WalkDir(filepath.Join("../..", root), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || filepath.Clean(path) == filepath.Clean("../../docs/configuration.md") {
				return err
			}
			b, err := os.ReadFile(path)
			for _, n := range name.FindAllString(string(b), -1) {
				seen[n] = true
			}
			return err
		})
		require.NoError(t, err)
	}
	require.Contains(t, seen, "KEYED_DEMO_TENANT", "the scan reads the demo and the manuals")
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	return out
}

// Load refuses a misspelled setting with the others, exit status 2's
// message, naming the setting meant and never the value; without the
// environment (Environ) it checks nothing.
func TestLoadRefusesAMisspelledSetting(t *testing.T) {
	t.Parallel()
	vars := workerEnv()
	vars["WORKER_MAX_ACTIVITES"] = "2"
	vars["STRIPE_SECRET_KEYS"] = stripeKey
	vars["LOG_LEVEL"] = "loud"
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l := config.NewLoader(config.Worker, env(vars))
	l.Environ(append(fxapptest.Environ(vars), "PATH=/usr/bin", "NO_EQUALS_SIGN"))
	_, err := l.Parse(fs, nil)
	require.ErrorIs(t, err, config.ErrInvalid)
	require.Contains(t, err.Error(), "(3 problems)")
	require.Contains(t, err.Error(), "WORKER_MAX_ACTIVITES: not a setting; did you mean WORKER_MAX_ACTIVITIES? Rename or unset it")
	require.Contains(t, err.Error(), "STRIPE_SECRET_KEYS: not a setting; did you mean STRIPE_SECRET_KEY?")
	require.NotContains(t, err.Error(), stripeKey)

	_, err = load(t, config.Worker, vars)
	require.ErrorContains(t, err, "(1 problems)", "only LOG_LEVEL without the environment")
}

// A variable of another program that looks like a misspelled setting is
// refused, the message saying how to let it through, and passes once
// KEYED_NOT_SETTINGS lists it.
func TestNotSettingsLetsAnotherProgramsVariableThrough(t *testing.T) {
	t.Parallel()
	load := func(extra map[string]string) error {
		vars := workerEnv()
		vars["DATABASE_URI"] = "mysql://other-app"
		maps.Copy(vars, extra)
		l := config.NewLoader(config.Worker, env(vars))
		l.Environ(fxapptest.Environ(vars))
		_, err := l.Load()
		return err
	}
	err := load(nil)
	require.ErrorIs(t, err, config.ErrInvalid)
	require.Contains(t, err.Error(), "DATABASE_URI: not a setting; did you mean DATABASE_URL? Rename or unset it, or list it in KEYED_NOT_SETTINGS if another program reads it")
	require.NotContains(t, err.Error(), "mysql")
	require.NoError(t, load(map[string]string{config.NotSettingsEnv: "OTHER, DATABASE_URI"}))
}
