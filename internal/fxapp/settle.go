package fxapp

import (
	"context"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/retention"
)

// SettleModule settles runs waiting for a decision from provider evidence
// (pipeline.Settler) once per SETTLE_EVERY window across all worker
// replicas: each window is an effect key, as the prune's are.
var SettleModule = fx.Module("settle",
	fx.Provide(newSettler),
	fx.Invoke(newSettleSchedule),
)

type settlerIn struct {
	fx.In
	Effects   *effects.Client
	Pool      *pgxpool.Pool
	Temporal  config.Temporal
	Client    client.Client
	Logger    *slog.Logger
	Pipelines []pipeline.Spec
	Providers []any `group:"providers"`
}

// newSettler returns the Settler of the worker's task queue over every
// pipeline's steps.
func newSettler(in settlerIn) (*pipeline.Settler, error) {
	logger := in.Logger.With("component", "settle")
	defs, err := pipeline.Definitions(in.Pipelines, pipeline.Deps{DB: in.Pool, Effects: in.Effects, Logger: logger, Providers: in.Providers})
	if err != nil {
		return nil, err
	}
	return pipeline.NewSettler(in.Client, defs, &pipeline.SettlerOpts{Logger: logger,
		Query: "TaskQueue = '" + strings.ReplaceAll(in.Temporal.TaskQueue, "'", "\\'") + "'"})
}

type settleIn struct {
	fx.In
	Lifecycle fx.Lifecycle
	Effects   *effects.Client
	Settler   *pipeline.Settler
	Tuning    config.WorkerTuning
	Logger    *slog.Logger
	Tracer    trace.TracerProvider `optional:"true"`
}

func newSettleSchedule(in settleIn) error {
	logger, s := in.Logger.With("component", "settle"), in.Settler
	job := tracedJob(in.Tracer, retention.Job{Name: "settle", Run: func(ctx context.Context) (int64, error) {
		verdicts, err := s.Pass(ctx)
		var applied int64
		for _, v := range verdicts {
			if v.Applied {
				applied++
			}
		}
		return applied, err
	}})
	p, err := retention.New(in.Effects, []retention.Job{job}, &retention.Opts{Every: in.Tuning.SettleEvery, Schedule: "settle", Logger: logger})
	if err != nil {
		return err
	}
	in.Lifecycle.Append(fx.Hook{OnStart: p.Start, OnStop: p.Stop})
	return nil
}
