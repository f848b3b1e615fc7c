package config_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/config"
)

// serve loads the configuration of starter serve.
func serve(t *testing.T, m map[string]string) (*config.Config, error) {
	t.Helper()
	l := config.NewLoader(config.Starter, env(m))
	l.Command("serve")
	return l.Load()
}

// The API's per-tenant rate limit: on by default for starter serve, set by
// KEYED_API_RATE_LIMIT and KEYED_API_RATE_BURST, off with a rate of 0, and
// refused, with every other problem, when it is not a rate.
func TestAPIRateLimit(t *testing.T) {
	t.Parallel()
	cfg, err := serve(t, nil)
	require.NoError(t, err)
	require.Equal(t, config.RateLimit{Rate: config.DefaultAPIRateLimit, Burst: config.DefaultAPIRateBurst}, cfg.API.RateLimit)

	cfg, err = serve(t, map[string]string{"KEYED_API_RATE_LIMIT": " 2.5 ", "KEYED_API_RATE_BURST": "5"})
	require.NoError(t, err)
	require.Equal(t, config.RateLimit{Rate: 2.5, Burst: 5}, cfg.API.RateLimit)

	cfg, err = serve(t, map[string]string{"KEYED_API_RATE_LIMIT": "0", "KEYED_API_RATE_BURST": "0"})
	require.NoError(t, err, "0 turns the limit off, whatever the burst")
	require.Zero(t, cfg.API.RateLimit.Rate)

	for v, msg := range map[string]string{
		"fast":  `KEYED_API_RATE_LIMIT: "fast" is not a number`,
		"-1":    "KEYED_API_RATE_LIMIT: -1 must be a number of requests a second, at least 0",
		"NaN":   "KEYED_API_RATE_LIMIT: NaN must be",
		"+Inf":  "KEYED_API_RATE_LIMIT: +Inf must be",
		"1e999": `KEYED_API_RATE_LIMIT: "1e999" is not a number`,
	} {
		_, err := serve(t, map[string]string{"KEYED_API_RATE_LIMIT": v, "LOG_LEVEL": "loud"})
		require.ErrorContains(t, err, msg, v)
		require.ErrorContains(t, err, "LOG_LEVEL", "reported with the other problems")
	}
	_, err = serve(t, map[string]string{"KEYED_API_RATE_BURST": "0"})
	require.ErrorContains(t, err, "KEYED_API_RATE_BURST: 0 must be at least 1 while KEYED_API_RATE_LIMIT is on")
	_, err = serve(t, map[string]string{"KEYED_API_RATE_BURST": "lots"})
	require.ErrorContains(t, err, `KEYED_API_RATE_BURST: "lots" is not a whole number`)

	cfg, err = load(t, config.Worker, workerEnv())
	require.NoError(t, err)
	require.Zero(t, cfg.API, "the worker serves no API")
}

// KEYED_API_MAX_CONNECTIONS: 0 (the open-file limit's share) by default, a
// cap of at least 16 otherwise.
func TestAPIMaxConnections(t *testing.T) {
	t.Parallel()
	cfg, err := serve(t, nil)
	require.NoError(t, err)
	require.Zero(t, cfg.API.MaxConns)
	cfg, err = serve(t, map[string]string{"KEYED_API_MAX_CONNECTIONS": "5000"})
	require.NoError(t, err)
	require.Equal(t, 5000, cfg.API.MaxConns)
	for v, msg := range map[string]string{
		"8":    "KEYED_API_MAX_CONNECTIONS: 8 must be 0 (three quarters of the open-file limit) or at least 16",
		"-1":   "KEYED_API_MAX_CONNECTIONS: -1 must be 0",
		"many": `KEYED_API_MAX_CONNECTIONS: "many" is not a whole number`,
	} {
		_, err := serve(t, map[string]string{"KEYED_API_MAX_CONNECTIONS": v})
		require.ErrorContains(t, err, msg, v)
	}
}
