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
// the next start. Apply holds a Postgres advisory lock for the whole run, so
// two workers starting together cannot both migrate; the second waits and
// then finds nothing to do. The lock is scoped to the current schema, so
// tests that give each case its own schema do not queue behind each other.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

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
}

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
		out = append(out, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Apply runs the effects migrations (see effects.Migrator) and then every
// file that has not run yet against the pool's current schema, and returns
// the versions of the files it applied. It returns an error naming the file
// or effects version that failed; earlier files stay applied.
func Apply(ctx context.Context, pool *pgxpool.Pool) (_ []int, err error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection for migrations: %w", err)
	}
	defer conn.Release()

	const lockKey = `hashtextextended('keyed.migrations:' || current_schema(), 0)`
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(`+lockKey+`)`); err != nil {
		return nil, fmt.Errorf("take migration lock: %w", err)
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

	migrator, err := effects.NewMigrator(conn.Conn(), nil)
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
	done := map[int]bool{}
	rows, err := conn.Query(ctx, `SELECT version FROM keyed_schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	for _, v := range versions {
		done[v] = true
	}

	var applied []int
	for _, m := range all {
		if done[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO keyed_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("apply migration %s: %w", m.Name, err)
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}
