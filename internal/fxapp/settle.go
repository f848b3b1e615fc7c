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
	fx.Invoke(newSettleSchedule),
)

type settleIn struct {
	fx.In
	Lifecycle fx.Lifecycle
	Effects   *effects.Client
	Pool      *pgxpool.Pool
	Tuning    config.WorkerTuning
	Temporal  config.Temporal
	Client    client.Client
	Logger    *slog.Logger
	Pipelines []pipeline.Spec
	Providers []any                `group:"providers"`
	Tracer    trace.TracerProvider `optional:"true"`
}

func newSettleSchedule(in settleIn) error {
	logger := in.Logger.With("component", "settle")
	defs, err := pipeline.Definitions(in.Pipelines, pipeline.Deps{DB: in.Pool, Effects: in.Effects, Logger: logger, Providers: in.Providers})
	if err != nil {
		return err
	}
	s, err := pipeline.NewSettler(in.Client, defs, &pipeline.SettlerOpts{Logger: logger,
		Query: "TaskQueue = '" + strings.ReplaceAll(in.Temporal.TaskQueue, "'", "\\'") + "'"})
	if err != nil {
		return err
	}
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
