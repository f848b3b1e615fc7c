package fakeproviders_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fakeproviders"
)

// TestEveryProviderHasAFake holds the table to the settings: each base-URL
// setting the worker reads (a provider it calls) has a fake, and each fake
// names such a setting. A provider added without its fake fails here, not
// in the demo a minute into a stuck run.
func TestEveryProviderHasAFake(t *testing.T) {
	t.Parallel()
	var bases []string
	for _, s := range config.Settings {
		if s.For&config.InWorker != 0 && strings.HasSuffix(s.Env, "_API_BASE") {
			bases = append(bases, s.Env)
		}
	}
	var faked []string
	ports := map[int]string{}
	for _, f := range fakeproviders.Fakes {
		faked = append(faked, f.Base)
		require.NotContains(t, ports, f.Port, "%s's port is %s's", f.Base, ports[f.Port])
		require.Positive(t, f.Port, f.Base)
		ports[f.Port] = f.Base
	}
	require.ElementsMatch(t, bases, faked, "the worker's *_API_BASE settings and the fakes of internal/fakeproviders")
}

// TestServeLeavesAProviderPointedElsewhere serves the fakes the caller did
// not point anywhere, each answering at its URL, and keeps the one it did.
func TestServeLeavesAProviderPointedElsewhere(t *testing.T) {
	t.Parallel()
	first := fakeproviders.Fakes[0].Base
	env := map[string]string{first: "http://127.0.0.1:1"}
	fakeproviders.ServeT(t, env)
	require.Equal(t, "http://127.0.0.1:1", env[first])
	for _, f := range fakeproviders.Fakes[1:] {
		require.NotEmpty(t, env[f.Base], f.Base)
		resp, err := http.Get(env[f.Base] + "/")
		require.NoError(t, err, f.Base)
		require.NoError(t, resp.Body.Close())
	}
}

// TestCompleteFillsWhatTheWorkerRequires adds every fake's base and every
// required setting's example, and overrides nothing the caller set.
func TestCompleteFillsWhatTheWorkerRequires(t *testing.T) {
	t.Parallel()
	env := fakeproviders.CompleteT(t, []string{"RECEIPT_FROM=mine@shop.example"})
	got := map[string]string{}
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		require.NotContains(t, got, name, "set twice")
		got[name] = value
	}
	require.Equal(t, "mine@shop.example", got["RECEIPT_FROM"])
	for _, f := range fakeproviders.Fakes {
		require.True(t, strings.HasPrefix(got[f.Base], "http://127.0.0.1:"), f.Base)
	}
	for name := range config.RequiredExamples(config.InWorker) {
		require.Contains(t, got, name)
	}
}
