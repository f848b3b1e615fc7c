package fxapp

import (
	"context"
	"log/slog"

	"go.uber.org/fx"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/retention"
)

// RetentionModule prunes finished effect records (older than
// EFFECTS_RETENTION) and expired collapse-window rows once per PRUNE_EVERY
// window across all worker replicas: each window is an effect key, so one
// replica does the work and the rest find it done. OnStart launches the
// loop and returns; OnStop ends it.
var RetentionModule = fx.Module("retention",
	fx.Provide(newPruner),
	fx.Invoke(func(*retention.Pruner) {}),
)

func newPruner(lc fx.Lifecycle, fxc *effects.Client, sender *notify.Sender, w config.WorkerTuning, logger *slog.Logger) (*retention.Pruner, error) {
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
	lc.Append(fx.Hook{OnStart: p.Start, OnStop: p.Stop})
	return p, nil
}
