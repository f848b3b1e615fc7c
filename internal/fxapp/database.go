package fxapp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/migrations"
	"github.com/keyedhq/keyed/orders"
)

// DatabaseModule provides the Postgres pool and the order store over it. On
// start it checks the connection and, when config.Database.Migrate is set
// (the worker's default), applies keyed's migrations; on stop it closes the
// pool.
var DatabaseModule = fx.Module("database",
	fx.Provide(newPool, newOrderStore),
)

// SchemaModule, for the long-running processes (the worker, the API, the
// relay), refuses to start when keyed's tables are missing from
// DATABASE_URL's schema and MIGRATE_ON_START is off: every activity or
// request would fail later instead. Some migrations pending is allowed (a
// release may run before its migrations, docs/operating.md) and logged; so
// is a schema that a newer build migrated further (a rolling deploy).
var SchemaModule = fx.Module("schema", fx.Invoke(requireSchema))

func requireSchema(lc fx.Lifecycle, pool *pgxpool.Pool, cfg config.Database, logger *slog.Logger) {
	lc.Append(fx.StartHook(func(ctx context.Context) error {
		if !cfg.Migrate {
			if err := requireTables(ctx, pool, cfg, logger); err != nil {
				return err
			}
		}
		return warnAhead(ctx, pool, cfg, logger)
	}))
}

// requireTables refuses a schema without keyed's tables and logs the
// migrations pending.
func requireTables(ctx context.Context, pool *pgxpool.Pool, cfg config.Database, logger *slog.Logger) error {
	all, err := migrations.All()
	if err != nil {
		return err
	}
	if _, err := migrations.CurrentSchema(ctx, pool); err != nil {
		return cmp.Or(noSchema(cfg, err), err)
	}
	effectsPending, appPending, err := migrations.Pending(ctx, pool)
	if err != nil {
		return fmt.Errorf("read keyed's migrations in %s: %w", cfg.Redacted(), err)
	}
	if len(appPending) == len(all) || len(effectsPending) == len(effects.Migrations()) {
		var path string
		if err := pool.QueryRow(ctx, `SELECT current_setting('search_path')`).Scan(&path); err != nil {
			return fmt.Errorf("read the search_path of %s: %w", cfg.Redacted(), err)
		}
		return configErrorf("keyed's tables are missing from %s (search_path %s) and MIGRATE_ON_START is off: "+
			"run `starter migrate` against it, start with MIGRATE_ON_START=true, or point DATABASE_URL's search_path at keyed's schema",
			cfg.Redacted(), path)
	}
	if len(effectsPending)+len(appPending) > 0 {
		logger.Warn("keyed's migrations are pending; run `starter migrate`", "database", cfg.Redacted(),
			"effects_pending", effectsPending, "app_pending", appPending)
	}
	return nil
}

// warnAhead logs the migrations a newer build applied that this one does
// not have: fine while a rolling deploy replaces this build, a forgotten
// old build otherwise. Older builds keep working on a newer schema, so it
// does not refuse to start.
func warnAhead(ctx context.Context, pool *pgxpool.Pool, cfg config.Database, logger *slog.Logger) error {
	effectsAhead, appAhead, err := migrations.Ahead(ctx, pool)
	if err != nil {
		return fmt.Errorf("read keyed's migrations in %s: %w", cfg.Redacted(), err)
	}
	if len(effectsAhead)+len(appAhead) > 0 {
		logger.Warn("the schema is ahead of this build: a newer build applied migrations this one does not have; "+
			"fine during a rolling deploy, otherwise deploy the newer build", "database", cfg.Redacted(),
			"effects_ahead", effectsAhead, "app_ahead", appAhead)
	}
	return nil
}

// noSchema returns, when err is a *migrations.NoSchemaError, the
// configuration error that says what to fix; else nil.
func noSchema(cfg config.Database, err error) error {
	var nse *migrations.NoSchemaError
	if !errors.As(err, &nse) {
		return nil
	}
	return configErrorf("DATABASE_URL's search_path (%s) names no existing schema in %s: "+
		"create the schema, or fix DATABASE_URL's search_path", nse.SearchPath, cfg.Redacted())
}

func newPool(lc fx.Lifecycle, full *config.Config, cfg config.Database, logger *slog.Logger) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		// pgx quotes the connection string; keep the password out of the message.
		return nil, configErrorf("DATABASE_URL is not a Postgres connection string")
	}
	if err := sizePool(pc, full); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc) // connects lazily
	if err != nil {
		return nil, fmt.Errorf("postgres %s: %w", cfg.Redacted(), err)
	}
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			if err := pool.Ping(ctx); err != nil {
				return fmt.Errorf("cannot reach Postgres at %s: %w", cfg.Redacted(), err)
			}
			if !cfg.Migrate {
				return nil
			}
			applied, err := migrations.Apply(ctx, pool, &migrations.Opts{Logger: logger})
			if err != nil {
				return cmp.Or(noSchema(cfg, err), fmt.Errorf("migrate %s: %w", cfg.Redacted(), err))
			}
			logger.Info("database ready", "database", cfg.Redacted(), "migrations_applied", applied)
			return nil
		},
		OnStop: func(context.Context) error {
			pool.Close()
			return nil
		},
	})
	return pool, nil
}

// Connections the worker holds or needs besides its activities: the outbox
// listener keeps one for LISTEN, the relay and the prune each use one.
const (
	workerReserved = 3
	// The activities' default share: they hold a connection only for a
	// claim or a short transaction, never while a provider answers, so a
	// few serve many slots. activityConnsPerCore per core of the worker's
	// host, at least minActivityConns and at most maxActivityConns: more
	// statements in flight than that only queue inside Postgres, which
	// spends more CPU on each (docs/benchmarks.md, "The worker's pool").
	activityConnsPerCore = 2
	minActivityConns     = 4
	maxActivityConns     = 16
)

// PoolNeeds returns the fewest connections the process of cfg's role can work
// with, and the default pool size when DATABASE_URL sets no pool_max_conns:
// for the worker, its reserved connections plus one, and by default its
// reserved connections plus ActivityConns; for the starter, one, and by
// default a few per core.
func PoolNeeds(cfg *config.Config) (least, def int32) {
	if cfg.Role == config.Worker {
		return workerReserved + 1, workerReserved + ActivityConns(cfg.Worker.MaxConcurrentActivities, runtime.GOMAXPROCS(0))
	}
	return 1, int32(max(4, runtime.NumCPU())) + 2
}

// ActivityConns is the worker's default pool share for slots activity
// slots on a host of cores cores: two a core, at least 4 and at most 16,
// and no more than the slots.
func ActivityConns(slots, cores int) int32 {
	return int32(min(max(slots, 1), max(minActivityConns, activityConnsPerCore*cores), maxActivityConns))
}

// sizePool sets pc's MaxConns from PoolNeeds when DATABASE_URL leaves it
// unset, and refuses an explicit pool_max_conns below the least the process
// needs, which would stall it.
func sizePool(pc *pgxpool.Config, cfg *config.Config) error {
	least, def := PoolNeeds(cfg)
	if !strings.Contains(cfg.Database.URL, "pool_max_conns") {
		pc.MaxConns = def
		return nil
	}
	if pc.MaxConns < least {
		return configErrorf("DATABASE_URL pool_max_conns=%d is below the %d connections the %s needs "+
			"(the outbox listener, the relay and the prune hold or use one each, and the activities at least one); "+
			"raise it or drop it to get the default of %d", pc.MaxConns, least, cfg.Role, def)
	}
	return nil
}

func newOrderStore(pool *pgxpool.Pool) (*orders.Store, error) {
	return orders.NewStore(pool)
}
