// Package effectstest helps test code built on package effects against a
// real Postgres: a fresh schema per test with the effects migrations
// applied, and the second-run check that every keyed handler deserves.
//
// NewPool and Connect create only the effects tables (keyed_effects and
// keyed_effects_migrations), through effects.Migrator. A test that needs its
// own tables too creates them on the returned pool, or runs its own
// migrations on a URL from NewSchema before calling Connect. The package
// depends on nothing outside effects, so a service that adopts effects
// without the rest of keyed can use it as it is.
//
// A handler is idempotent when running it twice with the same input leaves
// the system as it was after running it once. SecondRun checks exactly that:
//
//	func TestChargeTwice(t *testing.T) {
//		pool := effectstest.NewPool(t)
//		effectstest.SecondRun(t, pool, []string{"keyed_effects", "payments"}, func(ctx context.Context) error {
//			return handler(ctx, input)
//		})
//		require.Equal(t, 1, fakeProvider.Calls())
//	}
package effectstest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

// DefaultDatabaseURL is used when DATABASE_URL is not set.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// DatabaseURL returns $DATABASE_URL, or DefaultDatabaseURL when it is unset.
func DatabaseURL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultDatabaseURL
}

// tooManyConnections is Postgres's SQLSTATE when max_connections are all
// taken.
const tooManyConnections = "53300"

// NewSchema creates an empty schema with a random name in the database at
// DatabaseURL, drops it when the test ends, and returns its name and a
// connection string whose search_path points at it. It fails the test, with
// instructions for starting Postgres, when the database cannot be reached.
func NewSchema(t testing.TB) (schema, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	base := DatabaseURL()
	conn, err := pgx.Connect(ctx, base)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == tooManyConnections {
		t.Fatalf("effectstest: Postgres at %s has no free connection (%v): other tests, demos or workers on it hold them all; "+
			"stop what you left running (`make demo KEEP=1` keeps its worker), or raise max_connections", redact(base), err)
	}
	if err != nil {
		t.Fatalf("effectstest: cannot reach Postgres at %s: %v\n"+
			"Start it with `pg_ctlcluster --skip-systemctl-redirect 15 main start` "+
			"(install it with `apt-get install -y postgresql`), or point DATABASE_URL at a running server.", redact(base), err)
	}
	defer conn.Close(ctx)

	schema = "keyed_test_" + strings.ToLower(rand.Text())[:12]
	_, err = conn.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err, "create test schema")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("effectstest: drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Logf("effectstest: drop schema %s: %v", schema, err)
		}
	})
	cfg, err := pgx.ParseConfig(base)
	require.NoError(t, err)
	return schema, WithSearchPath(cfg.ConnString(), schema)
}

// NewExamplePool returns a pool on a new, empty schema with a random name
// in the database at DatabaseURL, and a function that closes the pool and
// drops the schema. It is for runnable examples, which have no testing.TB:
// it panics when Postgres cannot be reached. A real service connects to its
// own database instead.
func NewExamplePool(ctx context.Context) (*pgxpool.Pool, func()) {
	schema := "keyed_example_" + strings.ToLower(rand.Text())[:12]
	admin, err := pgxpool.New(ctx, DatabaseURL())
	if err != nil {
		panic(err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(fmt.Errorf("effectstest: create schema at %s (is Postgres running?): %w", redact(DatabaseURL()), err))
	}
	pool, err := pgxpool.New(ctx, WithSearchPath(DatabaseURL(), schema))
	if err != nil {
		panic(err)
	}
	return pool, func() {
		pool.Close()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			panic(err)
		}
		admin.Close()
	}
}

// WithSearchPath returns url with its search_path set to schema.
func WithSearchPath(url, schema string) string {
	sep := "?"
	for i := 0; i < len(url); i++ {
		if url[i] == '?' {
			sep = "&"
			break
		}
	}
	return url + sep + "search_path=" + schema
}

// PoolOpts configures NewPool. A nil *PoolOpts means all defaults.
type PoolOpts struct {
	// MaxConns sets the pool size. Zero means 16.
	MaxConns int32
	// Unpartitioned keeps keyed_effects unpartitioned, as an install from
	// before effects migration 2 that was not converted.
	Unpartitioned bool
}

// NewPool creates a fresh schema (see NewSchema), applies the effects
// migrations to it and returns a pool bound to it, closed when the test
// ends. It fails the test when Postgres cannot be reached or a migration
// fails.
func NewPool(t testing.TB, opts ...*PoolOpts) *pgxpool.Pool {
	t.Helper()
	_, url := NewSchema(t)
	return Connect(t, url, opts...)
}

// Connect opens a pool on url, applies the effects migrations (see
// effects.Migrator), and closes the pool when the test ends. It fails the
// test when a migration fails.
func Connect(t testing.TB, url string, opts ...*PoolOpts) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 16
	if len(opts) > 0 && opts[0] != nil && opts[0].MaxConns > 0 {
		cfg.MaxConns = opts[0].MaxConns
	}
	if len(opts) > 0 && opts[0] != nil && opts[0].Unpartitioned {
		cfg.ConnConfig.RuntimeParams["keyed.effects_partition"] = "off"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	migrator, err := effects.NewMigrator(pool, &effects.MigratorOpts{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx)
	require.NoError(t, err, "apply effects migrations")
	return pool
}

// NewClient returns an effects.Client on pool with opts, failing the test on
// error.
func NewClient(t testing.TB, pool *pgxpool.Pool, opts *effects.ClientOpts) *effects.Client {
	t.Helper()
	c, err := effects.NewClient(pool, opts)
	require.NoError(t, err)
	return c
}

// Snapshot returns every row of each table as JSON text, in a stable order,
// keyed by table name. Use it to compare the state before and after a run.
func Snapshot(t testing.TB, db effects.DB, tables ...string) map[string][]string {
	t.Helper()
	out := make(map[string][]string, len(tables))
	for _, table := range tables {
		rows, err := db.Query(context.Background(),
			fmt.Sprintf(`SELECT to_jsonb(t)::text AS j FROM %s t ORDER BY 1`, pgx.Identifier{table}.Sanitize()))
		require.NoError(t, err, "snapshot %s", table)
		vals, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, "snapshot %s", table)
		out[table] = vals
	}
	return out
}

// SecondRun runs run once, snapshots tables, runs it again, and fails the
// test unless the second run returns the same error (nil or not) and leaves
// every table exactly as the first run did. Pair it with assertions that a
// fake provider saw one call.
func SecondRun(t testing.TB, db effects.DB, tables []string, run func(ctx context.Context) error) {
	t.Helper()
	ctx := context.Background()
	first := run(ctx)
	before := Snapshot(t, db, tables...)
	second := run(ctx)
	if first == nil {
		require.NoError(t, second, "second run failed where the first succeeded")
	} else {
		require.Error(t, second, "second run succeeded where the first failed with %v", first)
	}
	after := Snapshot(t, db, tables...)
	for _, table := range tables {
		require.Equal(t, before[table], after[table], "second run changed table %s", table)
	}
}

func redact(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "(unparseable DATABASE_URL)"
	}
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}
