// Package config is keyed's typed runtime configuration for the worker and
// the starter's commands. It reads environment variables, lets flags
// override the ones that are not secret, and validates everything at once,
// so that a bad deployment gets one message that lists every problem
// instead of a panic or a drip of errors one restart at a time.
//
// Every setting is one row of Settings: its variable, its flag, the Config
// field it fills, the programs that read it, its default, whether it is a
// secret, its check and its texts. NewLoader, BindFlags and Load, the
// programs' usage text (Usage), Config's String and LogValue, and the
// generated page docs/configuration.md all follow that table, and tests
// fail when they disagree with it.
//
// Secrets come from the environment only, never from flags, which other
// users can read in the process list; they are held as Secret, which
// prints redacted whatever the verb, and Config's String and LogValue
// redact them. The Temporal connection's own secrets (TEMPORAL_API_KEY,
// the client key) are read by the Temporal SDK's envconfig (temporal.go).
//
// # Adding a setting
//
// Add its field to Config (or to one of its parts), then one row to
// Settings in settings.go, next to its neighbours. For a new provider,
// such as a shipping carrier with an API key and a base URL:
//
//	// in config.go: the part, and Carrier Carrier in Config
//	type Carrier struct {
//		APIKey  Secret // CARRIER_API_KEY
//		APIBase string // CARRIER_API_BASE
//	}
//
//	// in settings.go, in Settings
//	{Env: "CARRIER_API_KEY", Field: "Carrier.APIKey", For: InWorker, Required: InWorker, Secret: true,
//		Example: "ck_test_example", Help: "carrier API key"},
//	{Env: "CARRIER_API_BASE", Flag: "carrier-api-base", Field: "Carrier.APIBase", For: InWorker,
//		Default: "https://api.carrier.example", Check: baseURL, Help: "carrier API base `URL`"},
//
// That is all: the worker then reads, checks, redacts, logs, lists in -h
// and documents both, and the tests' worker environments (fxapptest) fill
// the required key with its Example (run go generate ./internal/config, or
// go test ./internal/config -run TestConfigurationPage -update, to rewrite
// docs/configuration.md). The provider's constructor in fxapp reads
// Config.Carrier from the *Config in the graph (docs/adding-an-activity.md).
// A check that involves other settings reads them from the *Config it is
// given. Load's code does not change.
//
// The rows stay in this package rather than in each provider's package:
// the table must be whole whatever a binary links, so that every program's
// -h and the docs page list the same settings, and each value needs a
// typed home in Config that fxapp can hand to one module.
package config

//go:generate go test -run TestConfigurationPage -update .
