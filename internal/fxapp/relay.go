package fxapp

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
)

// RelayModule runs the outbox relay: it moves committed outbox rows to
// Temporal with TemporalStarter, on the configured task queue. OnStart
// launches it and returns at once; OnStop stops it after its current batch
// and gives back the rows it claimed but did not start. When the app has a prometheus.Registerer, the outbox depth, the
// age of the oldest unsent row and the start counters are registered on it.
// Any number of relays may run against one database; each row is started
// by one of them. An optional *outbox.RelayOpts in the graph tunes it.
var RelayModule = fx.Module("relay",
	fx.Provide(newRelay),
	fx.Invoke(func(*outbox.Relay) {}),
)

type relayIn struct {
	fx.In
	Lifecycle  fx.Lifecycle
	Pool       *pgxpool.Pool
	Client     client.Client
	Temporal   config.Temporal
	Logger     *slog.Logger
	Pipelines  []pipeline.Spec
	Registerer prometheus.Registerer `optional:"true"`
	Opts       *outbox.RelayOpts     `optional:"true"`
}

func newRelay(in relayIn) (*outbox.Relay, error) {
	var opts outbox.RelayOpts
	if in.Opts != nil {
		opts = *in.Opts
	}
	if opts.Logger == nil {
		opts.Logger = in.Logger.With("component", "relay")
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = in.Temporal.RelayConcurrency
	}
	if in.Registerer != nil && opts.Metrics == nil {
		m, err := outbox.NewMetrics(in.Registerer)
		if err != nil {
			return nil, err
		}
		opts.Metrics = m
	}
	wake := make(chan struct{}, 1)
	opts.Wake = wake
	r, err := outbox.NewRelay(in.Pool, pipeline.Starter(in.Client, in.Pool, in.Temporal.TaskQueue, in.Pipelines), &opts)
	if err != nil {
		return nil, err
	}
	// The listener wakes the relay when a commit enqueues a start, so a
	// start reaches Temporal at once; polling stays as the safety net.
	listenCtx, stopListening := context.WithCancel(context.Background())
	listened := make(chan struct{})
	in.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			go func() {
				defer close(listened)
				outbox.Listen(listenCtx, in.Pool, wake, opts.Logger)
			}()
			return r.Start(ctx)
		},
		OnStop: func(ctx context.Context) error {
			err := r.Stop(ctx)
			stopListening()
			select {
			case <-listened:
			case <-ctx.Done():
			}
			return err
		},
	})
	return r, nil
}
