package effects

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// MigrationLine names the effects migration line in keyed_effects_migrations.
const MigrationLine = "main"

//go:embed migration/*.sql
var migrationFS embed.FS

// embedded holds the parsed migrations; a malformed file name is a build
// mistake, caught by every test that migrates.
var embedded, embeddedErr = parseMigrations(migrationFS, "migration")

// Migration is one version of the effects schema: an embedded SQL file.
type Migration struct {
	// Version numbers migrations from 1 without gaps.
	Version int
	// Name is the file name, such as "001_create_keyed_effects.sql".
	Name string
	// SQL is the file's content. Every file is idempotent.
	SQL string
}

// Migrations returns the effects migrations in version order, for a team's
// own migration tool, which must run each once, in order.
func Migrations() []Migration {
	return slices.Clone(embedded)
}

// ErrBadMigration is returned by NewMigrator when an embedded migration file
// is malformed: a name not of the form NNN_description.sql, or a gap or
// duplicate in the versions. It means a broken build of this package.
var ErrBadMigration = errors.New("effects: bad migration file")

func parseMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	out := make([]Migration, 0, len(entries))
	for i, e := range entries { // ReadDir sorts by name
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v != i+1 || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("%w: %q: want %03d_description.sql", ErrBadMigration, e.Name(), i+1)
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: e.Name(), SQL: string(body)})
	}
	return out, nil
}

// MigratorDB is what a Migrator needs from Postgres. *pgxpool.Pool and
// *pgx.Conn satisfy it.
type MigratorDB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// MigratorOpts configures a Migrator. A nil *MigratorOpts means all
// defaults.
type MigratorOpts struct {
	// Logger receives one record per applied version. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Migrator creates and upgrades keyed_effects in the current schema and
// records applied versions in keyed_effects_migrations under MigrationLine.
// It is safe for concurrent use, across processes too (an advisory lock per
// schema).
type Migrator struct {
	db         MigratorDB
	logger     *slog.Logger
	migrations []Migration
}

// NewMigrator returns a Migrator over db. It returns an error if db is nil,
// or one wrapping ErrBadMigration if the embedded files are malformed.
func NewMigrator(db MigratorDB, opts *MigratorOpts) (*Migrator, error) {
	if db == nil {
		return nil, errors.New("effects: NewMigrator: db is nil")
	}
	if embeddedErr != nil {
		return nil, embeddedErr
	}
	if opts == nil {
		opts = &MigratorOpts{}
	}
	m := &Migrator{db: db, logger: opts.Logger, migrations: embedded}
	if m.logger == nil {
		m.logger = slog.Default()
	}
	return m, nil
}

// Migrate applies every pending migration in one transaction and returns the
// versions applied, in order. On error nothing is applied; the error names the
// failed version and wraps the database error.
func (m *Migrator) Migrate(ctx context.Context) ([]int, error) {
	var applied []int
	err := pgx.BeginFunc(ctx, m.db, func(tx pgx.Tx) error {
		var err error
		applied, err = m.MigrateTx(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}

// MigrateTx is Migrate in the caller's transaction: the new schema becomes
// visible when tx commits, and a rollback undoes it. The advisory lock is
// held until tx ends. On error, which names the version that failed and
// wraps the database error, tx is aborted and must be rolled back.
func (m *Migrator) MigrateTx(ctx context.Context, tx pgx.Tx) ([]int, error) {
	var schema *string
	var path string
	if err := tx.QueryRow(ctx, `SELECT current_schema(), current_setting('search_path')`).Scan(&schema, &path); err != nil {
		return nil, fmt.Errorf("effects: read the current schema: %w", err)
	}
	if schema == nil {
		return nil, fmt.Errorf("effects: migrate: %w: search_path %s", ErrNoSchema, path)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('keyed.effects.migrations:' || current_schema(), 0))`); err != nil {
		return nil, fmt.Errorf("effects: take migration lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS keyed_effects_migrations (
		line       text        NOT NULL,
		version    integer     NOT NULL,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (line, version))`); err != nil {
		return nil, fmt.Errorf("effects: create keyed_effects_migrations: %w", err)
	}
	pending, err := m.pending(ctx, tx)
	if err != nil {
		return nil, err
	}
	applied := make([]int, 0, len(pending))
	for _, mig := range pending {
		if _, err := tx.Exec(ctx, mig.SQL); err != nil {
			return nil, fmt.Errorf("effects: apply migration %s: %w", mig.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO keyed_effects_migrations (line, version, name) VALUES ($1, $2, $3)`,
			MigrationLine, mig.Version, mig.Name); err != nil {
			return nil, fmt.Errorf("effects: record migration %s: %w", mig.Name, err)
		}
		m.logger.InfoContext(ctx, "effects: applied migration", "version", mig.Version, "name", mig.Name)
		applied = append(applied, mig.Version)
	}
	return applied, nil
}

// Pending returns the versions that Migrate would apply now, in order: all
// of them on a database that effects has never migrated. It changes
// nothing, and returns the database error, wrapped, when it cannot read
// keyed_effects_migrations.
func (m *Migrator) Pending(ctx context.Context) ([]int, error) {
	var versions []int
	err := pgx.BeginFunc(ctx, m.db, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('keyed_effects_migrations') IS NOT NULL`).Scan(&exists); err != nil {
			return fmt.Errorf("effects: look for keyed_effects_migrations: %w", err)
		}
		pending := m.migrations
		if exists {
			var err error
			if pending, err = m.pending(ctx, tx); err != nil {
				return err
			}
		}
		for _, mig := range pending {
			versions = append(versions, mig.Version)
		}
		return nil
	})
	return versions, err
}

// Ahead returns the versions keyed_effects_migrations records beyond this
// build's migrations, in order: a newer release migrated the schema. Each
// migration keeps the release before it working, so this is expected
// while a rolling deploy replaces this build. It changes nothing and
// returns the database error, wrapped.
func (m *Migrator) Ahead(ctx context.Context) ([]int, error) {
	var versions []int
	err := pgx.BeginFunc(ctx, m.db, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('keyed_effects_migrations') IS NOT NULL`).Scan(&exists); err != nil {
			return fmt.Errorf("effects: look for keyed_effects_migrations: %w", err)
		}
		if !exists {
			return nil
		}
		rows, err := tx.Query(ctx, `SELECT version FROM keyed_effects_migrations WHERE line = $1 AND version > $2 ORDER BY version`,
			MigrationLine, m.migrations[len(m.migrations)-1].Version)
		if err != nil {
			return fmt.Errorf("effects: read applied migrations: %w", err)
		}
		versions, err = pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return fmt.Errorf("effects: read applied migrations: %w", err)
		}
		return nil
	})
	return versions, err
}

// pending returns the migrations not yet recorded in keyed_effects_migrations,
// which must exist. Versions recorded by a newer release are left alone.
func (m *Migrator) pending(ctx context.Context, tx pgx.Tx) ([]Migration, error) {
	rows, err := tx.Query(ctx, `SELECT version FROM keyed_effects_migrations WHERE line = $1`, MigrationLine)
	if err != nil {
		return nil, fmt.Errorf("effects: read applied migrations: %w", err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("effects: read applied migrations: %w", err)
	}
	var out []Migration
	for _, mig := range m.migrations {
		if !slices.Contains(done, mig.Version) {
			out = append(out, mig)
		}
	}
	return out, nil
}
