package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/migrations"
)

// relay refuses a schema without keyed's tables at start, as the worker
// and serve do, instead of logging a missing relation forever.
func TestRelayRefusesAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	code, out, errOut := starter(t, map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1"}, "relay")
	require.Equal(t, 2, code, out+errOut)
	require.NotContains(t, out, "outbox relay running")
	require.Contains(t, errOut, "keyed's tables are missing from")
	require.Contains(t, errOut, "run `starter migrate` against it")
}

// A search_path naming no existing schema is bad configuration (exit 2)
// for migrate and for the long-running commands, said as such.
func TestSearchPathWithoutASchemaExitsTwo(t *testing.T) {
	t.Parallel()
	schema, _ := effectstest.NewSchema(t)
	absent := schema + "_absent"
	env := map[string]string{"DATABASE_URL": effectstest.WithSearchPath(effectstest.DatabaseURL(), absent),
		"TEMPORAL_ADDRESS": "127.0.0.1:1", "KEYED_API_KEYS": "acme=sk_live_0123456789abcdef"}
	code, out, errOut := starter(t, env, "migrate")
	require.Equal(t, 2, code, out+errOut)
	require.Contains(t, errOut, "names no existing schema: create it, or fix DATABASE_URL's search_path")
	for _, args := range [][]string{{"serve", "--addr", "127.0.0.1:0"}, {"serve", "--addr", "127.0.0.1:0", "--migrate"}, {"relay"}} {
		code, out, errOut = starter(t, env, args...)
		require.Equal(t, 2, code, "%v: %s", args, out+errOut)
		require.Contains(t, errOut, "DATABASE_URL's search_path ("+absent+") names no existing schema", args)
	}
}

// A schema a newer build migrated further: migrate says so and exits 0,
// and serve starts with a warning naming the versions.
func TestSchemaAheadOfTheBuild(t *testing.T) {
	t.Parallel()
	schema, url := effectstest.NewSchema(t)
	pool := dbtest.Connect(t, url)
	all, err := migrations.All()
	require.NoError(t, err)
	next := all[len(all)-1].Version + 1
	_, err = pool.Exec(context.Background(), `INSERT INTO keyed_schema_migrations (version, name) VALUES ($1, 'newer.sql')`, next)
	require.NoError(t, err)
	vars := map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1"}

	code, out, errOut := starter(t, vars, "migrate")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, fmt.Sprintf("schema %s is ahead of this build: it has migrations app [%d] that a newer build applied; "+
		"fine during a rolling deploy to that build, otherwise deploy it\n", schema, next), out)
	code, out, errOut = starter(t, vars, "migrate", "--json")
	require.Equal(t, 0, code, errOut)
	var res migrateResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, []int{next}, res.AppAhead)
	require.Empty(t, res.Applied)

	// serve runs until its context ends: a few seconds, enough to start.
	vars["KEYED_API_KEYS"] = "acme=sk_live_0123456789abcdef"
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	run(ctx, []string{"serve", "--addr", "127.0.0.1:0"}, &env{stdout: &stdout, stderr: &stderr, lookup: fxapptest.Lookup(vars)})
	require.Contains(t, stderr.String(), "the schema is ahead of this build")
	require.Contains(t, stderr.String(), fmt.Sprintf("app_ahead=[%d]", next))
}
