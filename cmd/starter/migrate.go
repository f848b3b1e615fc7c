package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/migrations"
)

// migrateResult is what migrate prints with --json.
type migrateResult struct {
	// Schema is the schema the migrations went to: the first existing one
	// on DATABASE_URL's search_path.
	Schema string `json:"schema"`
	// Applied lists the versions this run applied; empty when the schema
	// was up to date.
	Applied []int `json:"applied"`
	// Partitioned is set when --partition converted keyed_effects.
	Partitioned bool `json:"partitioned,omitempty"`
	// EffectsAhead and AppAhead list the versions the schema has that
	// this build does not: a newer build migrated it (migrations.Ahead).
	EffectsAhead []int `json:"effects_ahead,omitempty"`
	AppAhead     []int `json:"app_ahead,omitempty"`
}

func runMigrate(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "migrate", "[--json] [flags]",
		"Applies keyed's database migrations to the schema DATABASE_URL selects (search_path=SCHEMA, else\n"+
			"the database's default, usually public) and prints what it applied. The worker does this on start;\n"+
			"run it from a deployment job instead when workers run with MIGRATE_ON_START=false. With --partition it\n"+
			"then converts an unpartitioned keyed_effects to leaves online (docs/operating.md, \"Partitioning\").",
		config.TemporalFlags, config.MigrateFlag)
	asJSON := f.Bool("json", false, "print the result as JSON")
	partition := f.Bool("partition", false, "convert an unpartitioned keyed_effects online after migrating")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	var pool *pgxpool.Pool
	var logger *slog.Logger
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		var res migrateResult
		var err error
		if res.Schema, err = migrations.CurrentSchema(ctx, pool); err != nil {
			return noSchema(cfg, err)
		}
		applied, err := migrations.Apply(ctx, pool, &migrations.Opts{Logger: logger})
		if err != nil {
			return err
		}
		res.Applied = append([]int{}, applied...)
		if res.EffectsAhead, res.AppAhead, err = migrations.Ahead(ctx, pool); err != nil {
			return err
		}
		if *partition {
			if res.Partitioned, err = effects.Partition(ctx, pool); err != nil {
				return err
			}
		}
		if *asJSON {
			return writeJSON(e.stdout, res)
		}
		if res.Partitioned {
			if _, err := fmt.Fprintf(e.stdout, "converted keyed_effects in schema %s to partitioned leaves\n", clean(res.Schema)); err != nil {
				return err
			}
		}
		return printMigrated(e, res)
	}, &pool, &logger)
}

// noSchema makes a *migrations.NoSchemaError bad configuration (exit 2),
// saying what to fix; other errors are returned as they are.
func noSchema(cfg *config.Config, err error) error {
	var nse *migrations.NoSchemaError
	if !errors.As(err, &nse) {
		return err
	}
	return usagef("the search_path of DATABASE_URL (%s) names no existing schema: create it, or fix DATABASE_URL's search_path",
		cfg.Database.Redacted())
}

// printMigrated prints what migrate did and, when a newer build migrated
// the schema further, which versions this build does not have.
func printMigrated(e *env, res migrateResult) error {
	var err error
	switch {
	case len(res.Applied) > 0:
		_, err = fmt.Fprintf(e.stdout, "applied migrations %v to schema %s\n", res.Applied, clean(res.Schema))
	case len(res.EffectsAhead)+len(res.AppAhead) == 0:
		_, err = fmt.Fprintf(e.stdout, "schema %s is up to date\n", clean(res.Schema))
	}
	if err != nil || len(res.EffectsAhead)+len(res.AppAhead) == 0 {
		return err
	}
	_, err = fmt.Fprintf(e.stdout, "schema %s is ahead of this build: it has migrations %s that a newer build applied; "+
		"fine during a rolling deploy to that build, otherwise deploy it\n", clean(res.Schema), migrations.Versions(res.EffectsAhead, res.AppAhead))
	return err
}
