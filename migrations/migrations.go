// Package migrations holds keyed's SQL schema as numbered files and applies
// them.
//
// The effects tables belong to package effects, which has its own migration
// line (effects.Migrator, recorded in keyed_effects_migrations). Apply runs
// it first and then these files, so one call brings a database to the app's
// full schema. Versions 1, 6 and 9 once created the effects tables; they are
// kept as empty files so that databases which recorded them still match.
//
// Files are named NNNN_description.sql and run in order of NNNN. Each file
// runs in its own transaction together with the row that records it in
// keyed_schema_migrations, so a failed file leaves no trace and is retried on
// the next start. A file whose first line is NoTransaction runs outside a
// transaction, one statement at a time (statements end with a semicolon at
// the end of a line), and is recorded after its last statement: it is for
// CREATE INDEX CONCURRENTLY, which does not block writes, and must be safe to
// run again from the start (DROP INDEX CONCURRENTLY IF EXISTS first, since a
// failed concurrent build leaves an invalid index behind). Apply holds a
// Postgres advisory lock for the whole run, so two workers starting together
// cannot both migrate; the second polls for the lock, holding no snapshot a
// concurrent index build would wait for, and then finds nothing to do. The
// lock is scoped to the current schema, so tests that give each case its own
// schema do not queue behind each other.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyedhq/keyed/effects"
)

//go:embed *.sql
var files embed.FS

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
	// NoTransaction is set for a file whose first line is NoTransaction.
	NoTransaction bool
}

// NoTransaction, as a file's first line, runs it outside a transaction.
const NoTransaction = "-- keyed:no-transaction"

// lockPoll is how often Apply tries for the migration lock while another
// process holds it.
const lockPoll = 100 * time.Millisecond

// ErrBadMigration is returned by All when an embedded file name does not
// follow the NNNN_description.sql pattern or two files share a version.
var ErrBadMigration = errors.New("bad migration file")

// All returns the embedded migrations in version order. It returns an error
// wrapping ErrBadMigration when the files are malformed.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("%w: %q: want NNNN_description.sql", ErrBadMigration, name)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("%w: %q and %q share version %d", ErrBadMigration, prev, name, v)
		}
		seen[v] = name
		body, err := fs.ReadFile(files, name)
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		first, _, _ := strings.Cut(string(body), "\n")
		out = append(out, Migration{Version: v, Name: name, SQL: string(body), NoTransaction: strings.TrimSpace(first) == NoTransaction})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Opts configures Apply. A nil *Opts means all defaults.
type Opts struct {
	// Logger receives the effects line's record per version it applies
	// (effects.MigratorOpts). Nil means slog.Default().
	Logger *slog.Logger
}

// Apply runs the effects migrations (see effects.Migrator) and then every
// file that has not run yet against the pool's current schema, and returns
// the versions of the files it applied. It returns an error naming the file
// or effects version that failed, earlier files staying applied, or a
// *NoSchemaError when the search_path names no existing schema.
func Apply(ctx context.Context, pool *pgxpool.Pool, opts *Opts) (_ []int, err error) {
	if opts == nil {
		opts = &Opts{}
	}
	all, err := All()
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection for migrations: %w", err)
	}
	defer conn.Release()
	if _, err := CurrentSchema(ctx, conn); err != nil {
		return nil, err
	}

	const lockKey = `hashtextextended('keyed.migrations:' || current_schema(), 0)`
	if err := lock(ctx, conn.Conn(), lockKey); err != nil {
		return nil, err
	}
	defer func() {
		// A fresh context: the caller's may be cancelled, and the lock must
		// go. A session that cannot unlock is closed, which releases its
		// lock, and the pool then drops it.
		bg := context.WithoutCancel(ctx)
		if _, unlockErr := conn.Exec(bg, `SELECT pg_advisory_unlock(`+lockKey+`)`); unlockErr == nil {
			return
		}
		if closeErr := conn.Conn().Close(bg); closeErr != nil {
			err = errors.Join(err, fmt.Errorf("release migration lock: %w", closeErr))
		}
	}()

	migrator, err := effects.NewMigrator(conn.Conn(), &effects.MigratorOpts{Logger: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("create effects migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("migrate effects: %w", err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS keyed_schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("create keyed_schema_migrations: %w", err)
	}
	done, err := appliedVersions(ctx, conn)
	if err != nil {
		return nil, err
	}

	var applied []int
	for _, m := range all {
		if done[m.Version] {
			continue
		}
		if err := apply(ctx, conn.Conn(), m); err != nil {
			return applied, fmt.Errorf("apply migration %s: %w", m.Name, err)
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// Pending returns the versions of the effects migrations and of the files
// this build embeds that the pool's current schema has not applied, in
// order, without changing anything. It returns the database error.
func Pending(ctx context.Context, pool *pgxpool.Pool) (effectsPending, appPending []int, err error) {
	all, err := All()
	if err != nil {
		return nil, nil, err
	}
	migrator, err := effects.NewMigrator(pool, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("create effects migrator: %w", err)
	}
	if effectsPending, err = migrator.Pending(ctx); err != nil {
		return nil, nil, fmt.Errorf("read pending effects migrations: %w", err)
	}
	done, err := appliedVersions(ctx, pool)
	if err != nil {
		return nil, nil, err
	}
	for _, m := range all {
		if !done[m.Version] {
			appPending = append(appPending, m.Version)
		}
	}
	return effectsPending, appPending, nil
}

// Ahead returns the versions of the effects migrations and of the files
// that the pool's current schema records but this build does not have, in
// order: a newer build migrated the schema. Every migration keeps the
// previous build working on the new schema, so this is expected during a
// rolling deploy, and a sign of an older build left running otherwise. It
// returns the database error.
func Ahead(ctx context.Context, pool *pgxpool.Pool) (effectsAhead, appAhead []int, err error) {
	all, err := All()
	if err != nil {
		return nil, nil, err
	}
	m, err := effects.NewMigrator(pool, nil)
	if err != nil {
		return nil, nil, err
	}
	if effectsAhead, err = m.Ahead(ctx); err != nil {
		return nil, nil, err
	}
	done, err := appliedVersions(ctx, pool)
	if err != nil {
		return nil, nil, err
	}
	for _, m := range all {
		delete(done, m.Version)
	}
	for v := range done {
		appAhead = append(appAhead, v)
	}
	sort.Ints(appAhead)
	return effectsAhead, appAhead, nil
}

// Versions names the versions of each line for a message, as
// "effects [3], app [18]"; "" when there are none.
func Versions(effectsVersions, appVersions []int) string {
	var parts []string
	if len(effectsVersions) > 0 {
		parts = append(parts, fmt.Sprintf("effects %v", effectsVersions))
	}
	if len(appVersions) > 0 {
		parts = append(parts, fmt.Sprintf("app %v", appVersions))
	}
	return strings.Join(parts, ", ")
}

// NoSchemaError is CurrentSchema's error when no schema on the search_path
// exists: Postgres then has nowhere to create or find keyed's tables.
type NoSchemaError struct {
	// SearchPath is the session's search_path.
	SearchPath string
}

func (e *NoSchemaError) Error() string {
	return fmt.Sprintf("search_path %s names no existing schema", e.SearchPath)
}

// CurrentSchema returns the schema keyed's tables go to: the first
// existing one on db's search_path. It returns a *NoSchemaError when
// there is none, or the database error.
func CurrentSchema(ctx context.Context, db effects.DB) (string, error) {
	var schema *string
	var path string
	if err := db.QueryRow(ctx, `SELECT current_schema(), current_setting('search_path')`).Scan(&schema, &path); err != nil {
		return "", fmt.Errorf("read current schema: %w", err)
	}
	if schema == nil {
		return "", &NoSchemaError{SearchPath: path}
	}
	return *schema, nil
}

// appliedVersions returns the versions keyed_schema_migrations records,
// none when the table does not exist yet. It returns the database error.
func appliedVersions(ctx context.Context, db effects.DB) (map[int]bool, error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('keyed_schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look for keyed_schema_migrations: %w", err)
	}
	if !exists {
		return map[int]bool{}, nil
	}
	rows, err := db.Query(ctx, `SELECT version FROM keyed_schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	done := make(map[int]bool, len(versions))
	for _, v := range versions {
		done[v] = true
	}
	return done, nil
}

// lock takes the session advisory lock key on conn, trying every lockPoll
// until ctx ends. A blocking pg_advisory_lock would wait inside a statement
// whose snapshot a concurrent index build of the holder waits for: a
// deadlock.
func lock(ctx context.Context, conn *pgx.Conn, key string) error {
	for {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+key+`)`).Scan(&ok); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("take migration lock: %w", ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

// apply runs m and records it: in one transaction, or, for a NoTransaction
// file, statement by statement and then the record.
func apply(ctx context.Context, conn *pgx.Conn, m Migration) error {
	record := func(db effects.DB) error {
		_, err := db.Exec(ctx, `INSERT INTO keyed_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
		return err
	}
	if !m.NoTransaction {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			return record(tx)
		})
	}
	for _, stmt := range statements(m.SQL) {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	return record(conn)
}

// statements splits a NoTransaction file into its statements: each ends
// with a semicolon at the end of a line that is not a comment.
// Comment-only pieces are dropped.
func statements(sql string) []string {
	var out []string
	var cur strings.Builder
	flush := func() {
		stmt := strings.TrimSpace(cur.String())
		cur.Reset()
		for _, line := range strings.Split(stmt, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "--") {
				out = append(out, stmt)
				return
			}
		}
	}
	for _, line := range strings.SplitAfter(sql, "\n") {
		cur.WriteString(line)
		if l := strings.TrimSpace(line); strings.HasSuffix(l, ";") && !strings.HasPrefix(l, "--") {
			flush()
		}
	}
	flush()
	return out
}
