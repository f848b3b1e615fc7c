package fxapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"

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

func newPool(lc fx.Lifecycle, cfg config.Database, logger *slog.Logger) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		// pgx quotes the connection string; keep the password out of the message.
		return nil, errors.New("DATABASE_URL is not a Postgres connection string")
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
			applied, err := migrations.Apply(ctx, pool)
			if err != nil {
				return fmt.Errorf("migrate %s: %w", cfg.Redacted(), err)
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

func newOrderStore(pool *pgxpool.Pool) (*orders.Store, error) {
	return orders.NewStore(pool)
}
