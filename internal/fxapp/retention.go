package fxapp

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/retention"
)

// RetentionModule prunes finished effect records (older than
// EFFECTS_RETENTION) and expired collapse-window rows once per PRUNE_EVERY
// window across all worker replicas: each window is an effect key, so one
// replica does the work and the rest find it done. OnStart first refuses a
// retention too short for the namespace (see CheckRetention), then launches
// the loop and returns; OnStop ends it.
var RetentionModule = fx.Module("retention",
	fx.Provide(newPruner),
	fx.Invoke(func(*retention.Pruner) {}),
)

type prunerIn struct {
	fx.In
	Lifecycle  fx.Lifecycle
	Effects    *effects.Client
	Sender     *notify.Sender
	Tuning     config.WorkerTuning
	Temporal   config.Temporal
	Client     client.Client
	Logger     *slog.Logger
	Pipelines  []pipeline.Spec
	Registerer prometheus.Registerer
}

// effectsRetentionGauge exports EFFECTS_RETENTION, for the alert that
// compares the age of the duplicates that arrive with it.
func effectsRetentionGauge(reg prometheus.Registerer, d time.Duration) error {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "keyed_effects_retention_seconds",
		Help: "EFFECTS_RETENTION: finished effect records older than this are pruned."})
	g.Set(d.Seconds())
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register keyed_effects_retention_seconds: %w", err)
	}
	return nil
}

func newPruner(in prunerIn) (*retention.Pruner, error) {
	if err := effectsRetentionGauge(in.Registerer, in.Tuning.EffectsRetention); err != nil {
		return nil, err
	}
	lc, fxc, sender, w, logger := in.Lifecycle, in.Effects, in.Sender, in.Tuning, in.Logger
	jobs := []retention.Job{
		{Name: "effects", Run: func(ctx context.Context) (int64, error) {
			return fxc.Prune(ctx, &effects.PruneOpts{Retention: w.EffectsRetention})
		}},
		{Name: "sends", Run: sender.Prune},
	}
	p, err := retention.New(fxc, jobs, &retention.Opts{Every: w.PruneEvery, Logger: logger.With("component", "retention")})
	if err != nil {
		return nil, err
	}
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			run := pipeline.LongestRun(in.Pipelines) + w.DecisionTimeout
			if err := CheckRetention(ctx, in.Client, in.Temporal.Namespace, w.EffectsRetention, run); err != nil {
				return err
			}
			return p.Start(ctx)
		},
		OnStop: p.Stop,
	})
	return p, nil
}

// CheckRetention refuses an effects retention under which a retry could
// outlive its record: it must cover the namespace's workflow retention (a
// closed run can be reset and re-run until then) plus the longest run
// (pipeline.LongestRun and the decision timeout), and the API's
// Idempotency-Key retention (config.IdempotencyRetention). It returns an error naming the
// figures and the least retention that would do, or DescribeNamespace's.
func CheckRetention(ctx context.Context, c client.Client, namespace string, retention, longestRun time.Duration) error {
	resp, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("describe namespace %q to check EFFECTS_RETENTION: %w", namespace, err)
	}
	nsRetention := resp.GetConfig().GetWorkflowExecutionRetentionTtl().AsDuration()
	need := max(nsRetention+longestRun, config.IdempotencyRetention)
	if retention < need {
		return configErrorf("EFFECTS_RETENTION %s is shorter than namespace %q's retention %s plus the longest run %s "+
			"(retries and DECISION_TIMEOUT; or the API's Idempotency-Key retention %s): a reset or retry could outlive "+
			"its effect record and act again; set it to at least %s", retention, namespace, nsRetention, longestRun, config.IdempotencyRetention,
			need.Round(time.Hour)+time.Hour)
	}
	return nil
}
