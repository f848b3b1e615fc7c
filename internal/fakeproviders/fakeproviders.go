// Package fakeproviders is the one table of keyed's providers' fakes. The
// demo and every test that runs a worker serve each fake the caller does not
// serve itself on a local HTTP server and point the worker at it through the
// provider's base-URL setting, so a provider added with its row here is
// faked everywhere at once (docs/adding-an-activity.md).
package fakeproviders

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/internal/fakestripe"
)

// Fake is one provider's fake.
type Fake struct {
	// Base is the worker's setting naming the provider's API base URL,
	// such as STRIPE_API_BASE.
	Base string
	// Port is where cmd/fakes serves it (docker-compose's worker reaches it
	// at http://fakes:Port); every row has its own.
	Port int
	// New returns a fresh fake serving the provider's API in memory.
	New func() http.Handler
}

// Fakes is the table: one row per provider the worker calls.
var Fakes = []Fake{
	{Base: "STRIPE_API_BASE", Port: 12111, New: func() http.Handler { return fakestripe.New(nil) }},
	{Base: "SENDGRID_API_BASE", Port: 12112, New: func() http.Handler { return fakesendgrid.New(nil) }},
}

// Serve serves, each on a local HTTP server of its own, the fake of every
// provider whose base-URL setting env does not hold, and sets that setting
// in env to the server's URL. It returns a function that stops the
// servers.
func Serve(env map[string]string) (stop func()) {
	var servers []*httptest.Server
	for _, f := range Fakes {
		if _, set := env[f.Base]; set {
			continue
		}
		srv := httptest.NewServer(f.New())
		servers = append(servers, srv)
		env[f.Base] = srv.URL
	}
	return func() {
		for _, srv := range servers {
			srv.Close()
		}
	}
}

// ServeT is Serve, its servers stopped when t ends.
func ServeT(t testing.TB, env map[string]string) {
	t.Helper()
	t.Cleanup(Serve(env))
}

// Complete returns env (NAME=value entries that a worker process gets on
// top of this process's environment) with what a worker talking only to
// fakes needs and env does not set: the fake of each provider it does not
// point elsewhere (Serve), and WithExamples. stop stops the fakes' servers.
func Complete(env []string) (_ []string, stop func()) {
	served := map[string]string{}
	for name := range settings(env) {
		served[name] = "" // set by the caller: Serve leaves it
	}
	stop = Serve(served)
	for _, f := range Fakes {
		if url := served[f.Base]; url != "" {
			env = append(env, f.Base+"="+url)
		}
	}
	return WithExamples(env), stop
}

// WithExamples returns env (as for Complete) with the example of every
// setting the worker requires that neither env nor the environment sets,
// such as a new provider's key, so that the worker starts.
func WithExamples(env []string) []string {
	set := settings(env)
	examples := config.RequiredExamples(config.InWorker)
	for _, name := range slices.Sorted(maps.Keys(examples)) {
		_, inOS := os.LookupEnv(name)
		if _, inEnv := set[name]; !inOS && !inEnv {
			env = append(env, name+"="+examples[name])
		}
	}
	return env
}

// settings returns env's entries by name.
func settings(env []string) map[string]string {
	set := map[string]string{}
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		set[name] = value
	}
	return set
}

// CompleteT is Complete, the fakes' servers stopped when t ends.
func CompleteT(t testing.TB, env []string) []string {
	t.Helper()
	env, stop := Complete(env)
	t.Cleanup(stop)
	return env
}
