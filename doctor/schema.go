package doctor

import (
	"context"
	"fmt"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/migrations"
)

// schema checks that the database has every effects and app migration this
// build embeds: fails when some are not applied, as when a release runs
// with MIGRATE_ON_START=false before its migration job. Until then its
// claims look in every leaf, and what a pending file adds is missing. It
// warns when the database has migrations this build lacks: a newer build
// applied them, which older builds survive (migrations are written for
// rolling deploys), but one left behind should be replaced.
func (r *run) schema(ctx context.Context) []Check {
	const subject = "schema"
	effectsPending, appPending, err := migrations.Pending(ctx, r.deps.Pool)
	if err != nil {
		return []Check{errorCheck(CheckMigrations, subject, err, "check DATABASE_URL")}
	}
	effectsAhead, appAhead, err := migrations.Ahead(ctx, r.deps.Pool)
	if err != nil {
		return []Check{errorCheck(CheckMigrations, subject, err, "check DATABASE_URL")}
	}
	all, err := migrations.All()
	if err != nil {
		return []Check{errorCheck(CheckMigrations, subject, err, "")}
	}
	c := Check{Name: CheckMigrations, Subject: subject, Status: StatusPass, Evidence: fmt.Sprintf(
		"every migration this build has is applied: effects 1–%d, app 1–%d", len(effects.Migrations()), len(all))}
	if ahead := migrations.Versions(effectsAhead, appAhead); ahead != "" {
		c.Status = StatusWarn
		c.Evidence = "the schema has migrations this build does not: " + ahead + "; a newer build migrated it"
		c.Fix = "none during a rolling deploy to the newer build; otherwise deploy the newer build everywhere"
	}
	if pending := migrations.Versions(effectsPending, appPending); pending != "" {
		c.Status = StatusFail
		c.Evidence = "migrations not applied: " + pending + "; this build expects them"
		c.Fix = "run `starter migrate` (or start a worker with MIGRATE_ON_START=true)"
	}
	return []Check{c}
}
