package fxapp

import (
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/effects"
)

// EffectsModule provides the effects client over the pool. When the app
// has a prometheus.Registerer (MetricsModule), the client's counters and
// claim-latency histogram are registered on it.
var EffectsModule = fx.Module("effects",
	fx.Provide(newEffectsClient),
)

type effectsIn struct {
	fx.In
	Pool       *pgxpool.Pool
	Logger     *slog.Logger
	Registerer prometheus.Registerer `optional:"true"`
}

func newEffectsClient(in effectsIn) (*effects.Client, error) {
	var m *effects.Metrics
	if in.Registerer != nil {
		var err error
		if m, err = effects.NewMetrics(in.Registerer); err != nil {
			return nil, err
		}
	}
	return effects.NewClient(in.Pool, &effects.ClientOpts{Logger: in.Logger, Metrics: m})
}
