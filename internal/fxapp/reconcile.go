package fxapp

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	stripeclient "github.com/stripe/stripe-go/v76/client"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/reconcile"
	"github.com/keyedhq/keyed/retention"
)

// reconcileOverlap is how far each reconciliation reaches into the window
// before its own, so that a charge straddling a boundary or still in flight
// at the last run is checked.
const reconcileOverlap = time.Hour

// ReconcileModule reconciles keyed's records with Stripe once per
// RECONCILE_EVERY window across all worker replicas (each window an effect
// key, as the prune's), over the window before it plus reconcileOverlap,
// and exports the findings (keyed_reconcile_findings{kind}, the last
// success time) for the alert rules.
var ReconcileModule = fx.Module("reconcile", fx.Invoke(newReconcileSchedule))

type reconcileIn struct {
	fx.In
	Lifecycle  fx.Lifecycle
	Effects    *effects.Client
	Pool       *pgxpool.Pool
	Stripe     *stripeclient.API
	Sender     *notify.Sender
	Tuning     config.WorkerTuning
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	Tracer     trace.TracerProvider `optional:"true"`
	Settler    *pipeline.Settler    `optional:"true"`
	Client     client.Client
	Pipelines  []pipeline.Spec
}

// feedSettler hands the Settler each finding's run when it waits on the
// finding's step (an email SendGrid shows under a send still waiting, a
// charge Stripe holds without a record), so that it is settled now rather
// than at the next SETTLE_EVERY.
func feedSettler(ctx context.Context, in reconcileIn, findings []reconcile.Finding, logger *slog.Logger) {
	if in.Settler == nil {
		return
	}
	for _, f := range findings {
		key, err := effects.ParseKey(f.EffectKey)
		if err != nil {
			continue // Not an effect key of keyed's: nothing waits on it.
		}
		id, stepName, ok := pipeline.RunOfKey(in.Pipelines, key)
		if !ok {
			continue
		}
		w, err := pipeline.WaitOf(ctx, in.Client, id)
		if err != nil || w.Step != stepName {
			continue // Not waiting on this step: the finding stands for a person.
		}
		v := in.Settler.Settle(ctx, w)
		logger.InfoContext(ctx, "reconcile finding handed to the settler", "kind", string(f.Kind), "wait", w.Wait,
			"resolution", string(v.Resolution), "applied", v.Applied, "evidence", v.Evidence)
	}
}

// tracedJob runs j inside a span of its own, so that a scheduled job's
// provider calls are traced under it, not as roots.
func tracedJob(tp trace.TracerProvider, j retention.Job) retention.Job {
	if tp == nil {
		return j
	}
	run := j.Run
	j.Run = func(ctx context.Context) (int64, error) {
		ctx, span := tp.Tracer("github.com/keyedhq/keyed/internal/fxapp").Start(ctx, "schedule "+j.Name)
		defer span.End()
		n, err := run(ctx)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		return n, err
	}
	return j
}

func newReconcileSchedule(in reconcileIn) error {
	logger := in.Logger.With("component", "reconcile")
	if in.Tuning.ReconcileEvery == 0 {
		logger.Info("reconciliation with Stripe is off (RECONCILE_EVERY=0)")
		return nil
	}
	r, err := reconcile.New(in.Effects, in.Pool, in.Stripe, &reconcile.Opts{Registerer: in.Registerer, Logger: logger, Sender: in.Sender})
	if err != nil {
		return err
	}
	every := in.Tuning.ReconcileEvery
	job := tracedJob(in.Tracer, retention.Job{Name: "reconcile", Run: func(ctx context.Context) (int64, error) {
		to := retention.WindowStart(ctx)
		rep, err := r.Run(ctx, reconcile.Window{From: to.Add(-every - reconcileOverlap), To: to})
		if err != nil {
			return 0, err
		}
		feedSettler(ctx, in, rep.Findings, logger)
		return int64(len(rep.Findings)), nil
	}})
	p, err := retention.New(in.Effects, []retention.Job{job}, &retention.Opts{Every: every, Schedule: "reconcile", Logger: logger})
	if err != nil {
		return err
	}
	in.Lifecycle.Append(fx.Hook{OnStart: p.Start, OnStop: p.Stop})
	return nil
}
