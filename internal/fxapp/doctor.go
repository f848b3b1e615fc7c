package fxapp

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/internal/config"
)

// doctorTimeout bounds the worker's start-up report.
const doctorTimeout = 30 * time.Second

// DoctorModule runs doctor's cheap checks (doctor.CheapChecks) once the
// worker has started, in the background and within doctorTimeout, so it
// never delays or fails the start. It logs one line per check that did not
// pass, at warn level, with its status, evidence and fix,
// and exports each check's status as the keyed_doctor_check_status gauge.
// OnStop cancels a report still running.
var DoctorModule = fx.Module("doctor", fx.Invoke(startDoctor))

type doctorIn struct {
	fx.In
	Lifecycle  fx.Lifecycle
	Config     *config.Config
	Pool       *pgxpool.Pool
	Client     client.Client
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	Logger     *slog.Logger
}

func startDoctor(in doctorIn) error {
	m, err := doctor.NewMetrics(in.Registerer)
	if err != nil {
		return err
	}
	logger := in.Logger.With("component", "doctor")
	opts := DoctorOpts(in.Config, in.Pool)
	opts.Checks, opts.Gatherer = doctor.CheapChecks, in.Gatherer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	in.Lifecycle.Append(fx.Hook{
		OnStart: func(context.Context) error {
			go func() {
				defer close(done)
				ctx, cancel := context.WithTimeout(ctx, doctorTimeout)
				defer cancel()
				rep, err := doctor.Run(ctx, doctor.Deps{Pool: in.Pool, Temporal: in.Client}, &opts)
				if err != nil {
					logger.Warn("doctor could not run", "err", err)
					return
				}
				m.Observe(rep)
				logReport(ctx, logger, rep)
			}()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			cancel()
			select {
			case <-done:
			case <-ctx.Done():
			}
			return nil
		},
	})
	return nil
}

// logReport logs each check that did not pass, and a summary.
func logReport(ctx context.Context, logger *slog.Logger, rep *doctor.Report) {
	failed := 0
	for _, c := range rep.Checks {
		if c.Status == doctor.StatusPass {
			continue
		}
		failed++
		logger.Log(ctx, slog.LevelWarn, "doctor: "+c.Name+" "+c.Subject+": "+string(c.Status),
			"check", c.Name, "subject", c.Subject, "status", string(c.Status), "evidence", c.Evidence, "fix", c.Fix)
	}
	logger.Info("doctor checked the deployment", "checks", len(rep.Checks), "not_passed", failed, "exit_code", rep.ExitCode())
}

// DoctorOpts returns the doctor options of the deployment cfg describes:
// its namespace, EFFECTS_RETENTION and DECISION_TIMEOUT judged by
// CheckRetention, and its pool sizing: PoolNeeds against pool's MaxConns,
// or, when pool is nil, against DATABASE_URL's pool_max_conns or the size
// the worker picks without one.
func DoctorOpts(cfg *config.Config, pool *pgxpool.Pool) doctor.Opts {
	least, def := PoolNeeds(cfg)
	size := def
	if pool != nil {
		size = pool.Config().MaxConns
	} else if pc, err := pgxpool.ParseConfig(cfg.Database.URL); err == nil && strings.Contains(cfg.Database.URL, "pool_max_conns") {
		size = pc.MaxConns
	}
	return doctor.Opts{
		Namespace:        cfg.Temporal.Namespace,
		EffectsRetention: cfg.Worker.EffectsRetention,
		DecisionTimeout:  cfg.Worker.DecisionTimeout,
		CheckRetention:   CheckRetention,
		Pool:             doctor.PoolSizing{MaxConns: size, Least: least, Default: def, Slots: cfg.Worker.MaxConcurrentActivities},
	}
}
