package doctor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/reconcile"
	"github.com/keyedhq/keyed/step"
)

// retention checks EFFECTS_RETENTION (through Opts.CheckRetention), the
// Idempotency-Key retention and the outbox's.
func (r *run) retention(ctx context.Context) []Check {
	return []Check{r.effectsRetention(ctx), r.idempotencyRetention(), r.outboxRetention()}
}

func (r *run) effectsRetention(ctx context.Context) Check {
	const subject = "EFFECTS_RETENTION"
	resp, err := r.deps.Temporal.WorkflowService().DescribeNamespace(ctx,
		&workflowservice.DescribeNamespaceRequest{Namespace: r.o.Namespace})
	if err != nil {
		return errorCheck(CheckRetention, subject, fmt.Errorf("describe namespace %q: %w", r.o.Namespace, err),
			"check TEMPORAL_ADDRESS and TEMPORAL_NAMESPACE")
	}
	if r.o.CheckRetention == nil {
		return errorCheck(CheckRetention, subject, errors.New("no retention check wired"), "")
	}
	ns := resp.GetConfig().GetWorkflowExecutionRetentionTtl().AsDuration()
	var window string
	for i, a := range r.o.Activities {
		if i > 0 {
			window += ", "
		}
		window += a.Name + " " + days(step.RetryWindow(a.Options))
	}
	run := pipeline.LongestRun(r.o.Pipelines)
	if err := r.o.CheckRetention(ctx, r.deps.Temporal, r.o.Namespace, r.o.EffectsRetention, run+r.o.DecisionTimeout); err != nil {
		return Check{Name: CheckRetention, Subject: subject, Status: StatusFail, Evidence: err.Error(),
			Fix: "set EFFECTS_RETENTION on every worker to at least the value named, or shorten the namespace's retention"}
	}
	return Check{Name: CheckRetention, Subject: subject, Status: StatusPass, Evidence: fmt.Sprintf(
		"%s covers namespace %q's retention %s + the longest run %s (retry windows: %s) + DECISION_TIMEOUT %s, and the Idempotency-Key retention %s",
		days(r.o.EffectsRetention), r.o.Namespace, days(ns), days(run), window, days(r.o.DecisionTimeout),
		days(r.o.IdempotencyRetention))}
}

func (r *run) idempotencyRetention() Check {
	c := Check{Name: CheckRetention, Subject: "Idempotency-Key", Status: StatusPass,
		Evidence: fmt.Sprintf("stored responses kept %s, at least the published %s", days(r.o.IdempotencyRetention), days(config.IdempotencyRetention))}
	if r.o.IdempotencyRetention < config.IdempotencyRetention {
		c.Status = StatusFail
		c.Evidence = fmt.Sprintf("stored responses kept %s, less than the published %s: a client retrying within the promise could create a second order",
			days(r.o.IdempotencyRetention), days(config.IdempotencyRetention))
		c.Fix = fmt.Sprintf("keep Idempotency-Keys at least %s (api.StoreOpts.Retention)", days(config.IdempotencyRetention))
	}
	return c
}

func (r *run) outboxRetention() Check {
	c := Check{Name: CheckRetention, Subject: "outbox", Status: StatusPass,
		Evidence: fmt.Sprintf("sent rows kept %s, longer than the relay's longest backoff %s", days(r.o.OutboxRetention), days(r.o.RelayMaxBackoff))}
	if r.o.OutboxRetention < r.o.RelayMaxBackoff {
		c.Status = StatusFail
		c.Evidence = fmt.Sprintf("sent rows kept %s, less than the relay's longest backoff %s: a row can be pruned before the retry that would find it sent",
			days(r.o.OutboxRetention), days(r.o.RelayMaxBackoff))
		c.Fix = "raise outbox.RelayOpts.Retention above MaxBackoff"
	}
	return c
}

// pool checks the worker's pool size against its needs and shows
// Postgres's connection limit.
func (r *run) pool(ctx context.Context) []Check {
	p := r.o.Pool
	c := Check{Name: CheckPool, Subject: "worker"}
	if p.MaxConns == 0 {
		return []Check{errorCheck(CheckPool, "worker", errors.New("the worker's pool size was not given"), "")}
	}
	var maxConns string
	if err := r.deps.Pool.QueryRow(ctx, `SHOW max_connections`).Scan(&maxConns); err != nil {
		return []Check{errorCheck(CheckPool, "worker", fmt.Errorf("read max_connections: %w", err), "")}
	}
	need := fmt.Sprintf("the worker needs at least %d (the outbox listener, the relay and the prune hold or use one each, "+
		"the activities at least one) and by default takes %d for %d activity slots on %d cores; Postgres allows %s in all",
		p.Least, p.Default, p.Slots, p.Cores, maxConns)
	switch {
	case p.MaxConns < p.Least:
		c.Status, c.Evidence = StatusFail, fmt.Sprintf("pool_max_conns=%d: %s; the worker refuses to start", p.MaxConns, need)
		c.Fix = fmt.Sprintf("raise pool_max_conns in DATABASE_URL to at least %d, or drop it to get %d", p.Least, p.Default)
	case p.MaxConns < p.Default:
		c.Status, c.Evidence = StatusWarn, fmt.Sprintf("pool_max_conns=%d: %s; activities queue for connections under load", p.MaxConns, need)
		c.Fix = fmt.Sprintf("raise pool_max_conns to %d, or lower WORKER_MAX_ACTIVITIES to match", p.Default)
	default:
		c.Status, c.Evidence = StatusPass, fmt.Sprintf("%d connections: %s", p.MaxConns, need)
	}
	return []Check{c}
}

// neverReconciled is the reconcile check of a deployment with no
// successful run: a failure, unless keyed's tables are younger than the
// period (a new install, whose first run is not due yet); an error when
// their age cannot be read.
func (r *run) neverReconciled(ctx context.Context, subject, fix string) Check {
	c := Check{Name: CheckReconcile, Subject: subject, Status: StatusFail,
		Evidence: "no successful reconciliation with Stripe was ever recorded in keyed_reconcile_runs", Fix: fix}
	var created *time.Time
	err := r.deps.Pool.QueryRow(ctx, `SELECT min(applied_at) FROM keyed_schema_migrations`).Scan(&created)
	if err != nil {
		return errorCheck(CheckReconcile, subject, fmt.Errorf("read when keyed's tables were created: %w", err), "")
	}
	if created == nil { // no migration recorded: the age unknown, the failure stands
		return c
	}
	if age := r.now.Sub(*created); age < r.o.ReconcileEvery {
		c.Status, c.Fix = StatusPass, ""
		c.Evidence = fmt.Sprintf("no reconciliation recorded yet: keyed's tables were created %s ago, within the period %s",
			days(age.Round(time.Minute)), days(r.o.ReconcileEvery))
	}
	return c
}

// reconcile checks that a reconciliation with Stripe succeeded within its
// period, from the runs package reconcile records; a new install passes
// until its first period is over.
func (r *run) reconcile(ctx context.Context) []Check {
	const subject = "deployment"
	fix := "let the worker reconcile (RECONCILE_EVERY, an hour by default; not 0), or run `starter reconcile --since 25h` daily (see docs/operating.md, \"Reconciling charges with Stripe\")"
	last, err := reconcile.Last(ctx, r.deps.Pool)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, reconcile.ErrNeverRan):
		return []Check{r.neverReconciled(ctx, subject, fix)}
	case errors.As(err, &pgErr) && pgErr.Code == "42P01":
		return []Check{errorCheck(CheckReconcile, subject, err, "apply keyed's migrations (starter migrate, or start a worker)")}
	case err != nil:
		return []Check{errorCheck(CheckReconcile, subject, err, "")}
	}
	age := r.now.Sub(last.FinishedAt)
	c := Check{Name: CheckReconcile, Subject: subject, Status: StatusPass, Evidence: fmt.Sprintf(
		"last successful run %s ago (period %s), window %s to %s: %d charge records, %d payment intents, %d findings",
		days(age.Round(time.Minute)), days(r.o.ReconcileEvery), last.Window.From.UTC().Format(time.RFC3339),
		last.Window.To.UTC().Format(time.RFC3339), last.Records, last.PaymentIntents, last.Findings)}
	switch {
	case age > r.o.ReconcileEvery:
		c.Status, c.Fix = StatusFail, "the reconcile job stopped succeeding: look at its last runs; "+fix
	case last.Findings > 0:
		c.Status, c.Fix = StatusWarn, "keyed and Stripe disagreed: run starter reconcile with that window and settle each finding"
	}
	return []Check{c}
}
