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
	"github.com/keyedhq/keyed/idempotency"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/retention"
	"github.com/keyedhq/keyed/step"
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
	if w.MoneyRetention < w.EffectsRetention {
		return nil, configErrorf("MONEY_RETENTION %s is shorter than EFFECTS_RETENTION %s: charges and refunds must be kept at least as long as any record",
			w.MoneyRetention, w.EffectsRetention)
	}
	lifetimes, err := Lifetimes(in.Pipelines, w)
	if err != nil {
		return nil, err
	}
	log := logger.With("component", "retention")
	jobs := []retention.Job{
		{Name: "effects", Run: func(ctx context.Context) (int64, error) { return retireEffects(ctx, fxc, lifetimes, w, log) }},
		{Name: "sends", Run: sender.Prune},
	}
	p, err := retention.New(fxc, jobs, &retention.Opts{Every: w.PruneEvery, Logger: log})
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

// Lifetimes is the one table of effect kinds and lifetimes: the steps the
// pipelines declare with step.KeepMoney keep MONEY_RETENTION, the API's
// Idempotency-Key records the published 24 hours, every other kind
// (receipts, mark-paid, decisions) EFFECTS_RETENTION.
func Lifetimes(specs []pipeline.Spec, w config.WorkerTuning) ([]effects.Lifetime, error) {
	table, err := pipeline.Lifetimes(specs, map[step.Keep]time.Duration{
		step.KeepDefault: w.EffectsRetention, step.KeepMoney: w.MoneyRetention})
	if err != nil {
		return nil, err
	}
	return append(table, effects.Lifetime{Kind: idempotency.Kind, Keep: config.IdempotencyRetention}), nil
}

// retireEffects sets the lifetimes (and their leaves), drops expired leaves
// (logging those a claim in flight keeps) and prunes the legacy partition,
// if any, by EFFECTS_RETENTION; it returns the leaves dropped plus the
// legacy records deleted. It runs in the retention window, not at start:
// claims before it go to the default class, and a claim makes a missing
// leaf itself.
func retireEffects(ctx context.Context, fxc *effects.Client, lifetimes []effects.Lifetime, w config.WorkerTuning, log *slog.Logger) (int64, error) {
	if err := fxc.SetLifetimes(ctx, lifetimes, &effects.SetLifetimesOpts{LeavesPerLifetime: w.LeavesPerLifetime}); err != nil {
		return 0, err
	}
	res, err := fxc.Retire(ctx, nil)
	if err != nil {
		return 0, err
	}
	for leaf, n := range res.Blocked {
		log.WarnContext(ctx, "effect leaf past its lifetime kept: it holds claims in flight", "leaf", leaf, "claims", n)
	}
	if len(res.Dropped) > 0 {
		log.InfoContext(ctx, "effect leaves past their lifetime dropped", "leaves", res.Dropped, "drop_took", res.DropTook)
	}
	n, err := fxc.Prune(ctx, &effects.PruneOpts{Retention: w.EffectsRetention})
	return int64(len(res.Dropped)) + n, err
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
