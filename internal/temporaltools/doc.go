// Package temporaltools pins the Temporal server, its SQL schema tool and
// the Web UI server that `make tools` builds into bin/ for `make cluster`
// and internal/tempcluster. It is a module of its own, so that keyed's
// go.mod does not carry the server's dependencies; its go.mod is the
// Temporal CLI v1.5.1's (server v1.29.1, ui-server v2.42.1), so the three
// tools match the dev server keyed tests against.
package temporaltools
