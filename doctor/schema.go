package doctor

import (
	"context"
	"fmt"
	"strings"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/migrations"
)

// schema checks that the database has every effects and app migration this
// build embeds: fails when some are not applied, as when a release runs
// with MIGRATE_ON_START=false before its migration job. Until then its
// claims look in every leaf, and what a pending file adds is missing.
func (r *run) schema(ctx context.Context) []Check {
	const subject = "schema"
	effectsPending, appPending, err := migrations.Pending(ctx, r.deps.Pool)
	if err != nil {
		return []Check{errorCheck(CheckMigrations, subject, err, "check DATABASE_URL")}
	}
	all, err := migrations.All()
	if err != nil {
		return []Check{errorCheck(CheckMigrations, subject, err, "")}
	}
	c := Check{Name: CheckMigrations, Subject: subject, Status: StatusPass, Evidence: fmt.Sprintf(
		"every migration this build has is applied: effects 1–%d, app 1–%d", len(effects.Migrations()), len(all))}
	if len(effectsPending)+len(appPending) > 0 {
		var missing []string
		if len(effectsPending) > 0 {
			missing = append(missing, fmt.Sprintf("effects %v", effectsPending))
		}
		if len(appPending) > 0 {
			missing = append(missing, fmt.Sprintf("app %v", appPending))
		}
		c.Status = StatusFail
		c.Evidence = "migrations not applied: " + strings.Join(missing, ", ") + "; this build expects them"
		c.Fix = "run `starter migrate` (or start a worker with MIGRATE_ON_START=true)"
	}
	return []Check{c}
}
