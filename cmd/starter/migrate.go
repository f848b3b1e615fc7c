package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyedhq/keyed/migrations"
)

func runMigrate(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "migrate", "[flags]",
		"Applies keyed's database migrations to DATABASE_URL and prints what it applied. The worker does\n"+
			"this on start; run it from a deployment job instead when workers run with MIGRATE_ON_START=false.")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	cfg.Database.Migrate = false // applied here, to report the versions
	var pool *pgxpool.Pool
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		applied, err := migrations.Apply(ctx, pool)
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			_, err = fmt.Fprintln(e.stdout, "schema is up to date")
			return err
		}
		_, err = fmt.Fprintf(e.stdout, "applied migrations %v\n", applied)
		return err
	}, &pool)
}
