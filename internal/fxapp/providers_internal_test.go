package fxapp

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/config"
)

// A provider's client keeps its connections when as many calls are in
// flight as the worker runs activities: a second wave of 32 concurrent
// calls dials (almost) nothing, where http.DefaultTransport, which keeps two
// idle connections a host, dials most of them again.
func TestProviderClientKeepsItsConnections(t *testing.T) {
	t.Parallel()
	var dialed atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(100 * time.Millisecond) // all 32 calls of a wave in flight at once
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialed.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	wave := func(c *http.Client) int64 {
		before := dialed.Load()
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				resp, err := c.Get(srv.URL)
				if assert.NoError(t, err) {
					assert.NoError(t, resp.Body.Close())
				}
			})
		}
		wg.Wait()
		return dialed.Load() - before
	}
	keyed := newProviderHTTP(providerHTTPIn{Worker: config.WorkerTuning{MaxConcurrentActivities: 64}})()
	require.EqualValues(t, 32, wave(keyed), "the first wave dials a connection per call")
	again := wave(keyed)
	require.LessOrEqual(t, again, int64(2), "the second wave reuses them")

	plain := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	wave(plain)
	plainAgain := wave(plain)
	require.Greater(t, plainAgain, int64(20), "http.DefaultTransport's settings dial again")
	t.Logf("second wave of 32 calls dialled %d connections, %d with http.DefaultTransport's settings", again, plainAgain)
}
