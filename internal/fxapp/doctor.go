package fxapp

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/pipeline"
)

// doctorTimeout bounds each report of the worker's.
const doctorTimeout = 30 * time.Second

// DefaultDoctorEvery is how often a worker repeats its doctor report after
// the one at start, so that keyed_doctor_check_status follows the
// deployment (a reconciliation that ran since, a fixed attribute).
const DefaultDoctorEvery = time.Hour

// DoctorEvery, supplied to the worker app, replaces DefaultDoctorEvery
// (for tests).
type DoctorEvery time.Duration

// DoctorModule runs doctor's cheap checks (doctor.CheapChecks) once the
// worker has started and then every DefaultDoctorEvery, in the background
// and each within doctorTimeout, so it never delays or fails the start. The
// first report logs one line per check that did not pass, at warn level,
// with its status, evidence and fix; later ones log a check whose status
// changed (at info level when it now passes). Each report sets the keyed_doctor_check_status gauge. OnStop
// ends the loop.
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
	Pipelines  []pipeline.Spec
	Every      DoctorEvery `optional:"true"`
}

func startDoctor(in doctorIn) error {
	m, err := doctor.NewMetrics(in.Registerer)
	if err != nil {
		return err
	}
	every := time.Duration(in.Every)
	if every <= 0 {
		every = DefaultDoctorEvery
	}
	d := &doctorLoop{deps: doctor.Deps{Pool: in.Pool, Temporal: in.Client}, opts: DoctorOpts(in.Config, in.Pool),
		metrics: m, logger: in.Logger.With("component", "doctor"), last: map[[2]string]doctor.Status{}}
	d.opts.Checks, d.opts.Gatherer, d.opts.Pipelines = doctor.CheapChecks, in.Gatherer, in.Pipelines
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	in.Lifecycle.Append(fx.Hook{
		OnStart: func(context.Context) error {
			go func() {
				defer close(done)
				d.loop(ctx, every)
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

// doctorLoop is a worker's repeated doctor report.
type doctorLoop struct {
	deps    doctor.Deps
	opts    doctor.Opts
	metrics *doctor.Metrics
	logger  *slog.Logger
	// last is each check's status in the previous report, by check and
	// subject.
	last map[[2]string]doctor.Status
}

func (d *doctorLoop) loop(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		d.report(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// report runs the checks once, sets the gauge, and logs each check that
// did not pass the first time, or whose status changed since.
func (d *doctorLoop) report(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()
	rep, err := doctor.Run(ctx, d.deps, &d.opts)
	if err != nil {
		d.logger.Warn("doctor could not run", "err", err)
		return
	}
	d.metrics.Observe(rep)
	first := len(d.last) == 0
	notPassed := 0
	for _, c := range rep.Checks {
		id := [2]string{c.Name, c.Subject}
		prev, seen := d.last[id]
		d.last[id] = c.Status
		if c.Status != doctor.StatusPass {
			notPassed++
		}
		if (first || !seen) && c.Status == doctor.StatusPass || seen && prev == c.Status {
			continue
		}
		level := slog.LevelWarn
		if c.Status == doctor.StatusPass {
			level = slog.LevelInfo // Fixed since the last report.
		}
		d.logger.Log(ctx, level, "doctor: "+c.Name+" "+c.Subject+": "+string(c.Status),
			"check", c.Name, "subject", c.Subject, "status", string(c.Status), "evidence", c.Evidence, "fix", c.Fix)
	}
	if first {
		d.logger.Info("doctor checked the deployment", "checks", len(rep.Checks), "not_passed", notPassed, "exit_code", rep.ExitCode())
	}
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
	sizing := doctor.PoolSizing{MaxConns: size, Least: least, Default: def,
		Slots: cfg.Worker.MaxConcurrentActivities, Cores: runtime.GOMAXPROCS(0)}
	return doctor.Opts{
		Namespace:        cfg.Temporal.Namespace,
		EffectsRetention: cfg.Worker.EffectsRetention,
		DecisionTimeout:  cfg.Worker.DecisionTimeout,
		CheckRetention:   CheckRetention,
		Pool:             sizing,
		ProviderRates:    ProviderRates(cfg.Temporal.TaskQueue, cfg.Stripe, cfg.SendGrid),
	}
}
