// Package fxapp wires keyed's programs together with fx. It is the only
// package that imports fx: effects, orders, activities and workflows are
// plain Go, and each module here turns one of them into a provider with
// lifecycle hooks that never block.
//
// Worker and Starter assemble the modules for cmd/worker and cmd/starter;
// tests build the same graphs, so what is tested is what ships.
package fxapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.uber.org/dig"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/workflows"
)

// startTimeout bounds the start hooks: connecting, migrating, first poll.
const startTimeout = time.Minute

// Worker returns the options of the worker app: Postgres with migrations,
// effects, Temporal, the Stripe and SendGrid providers, the Temporal worker
// running the order workflow and its activities, /metrics and /healthz, and
// the outbox relay, the scheduled prune, and doctor's start-up report. Extra
// options are appended, for tests.
func Worker(cfg *config.Config, logger *slog.Logger, extra ...fx.Option) fx.Option {
	return fx.Options(
		base(cfg, logger),
		DatabaseModule,
		SchemaModule,
		EffectsModule,
		TemporalModule,
		ProvidersModule,
		MetricsModule,
		WorkerModule,
		RelayModule,
		RetentionModule,
		SettleModule,
		ReconcileModule,
		DoctorModule,
		// The stop hooks must outlast the worker's drain of in-flight activities.
		fx.StopTimeout(cfg.Worker.StopTimeout+15*time.Second),
		fx.Options(extra...),
	)
}

// Starter returns the options of the starter app: Postgres, the order store,
// effects (read-only use, no metrics) and a Temporal client. It needs no
// provider keys. Extra options are appended, for tests and commands.
func Starter(cfg *config.Config, logger *slog.Logger, extra ...fx.Option) fx.Option {
	return fx.Options(
		base(cfg, logger),
		DatabaseModule,
		EffectsModule,
		TemporalModule,
		fx.Options(extra...),
	)
}

func base(cfg *config.Config, logger *slog.Logger) fx.Option {
	return fx.Options(
		fx.Supply(cfg, logger),
		fx.WithLogger(func(l *slog.Logger) fxevent.Logger {
			fl := &fxevent.SlogLogger{Logger: l.With("component", "fx")}
			// The graph's own chatter (provided, invoked, hook ran) is debug
			// output, and so are its errors: Serve and Run report each failure
			// once, reduced to its root cause.
			fl.UseLogLevel(slog.LevelDebug)
			fl.UseErrorLevel(slog.LevelDebug)
			return fl
		}),
		fx.StartTimeout(startTimeout),
		fx.Provide(workflows.Pipelines),
		ConfigModule,
		TracingModule,
	)
}

// ConfigModule splits the supplied *config.Config into the parts the other
// modules depend on, so that each module sees only its own settings.
var ConfigModule = fx.Module("config", fx.Provide(splitConfig))

type configParts struct {
	fx.Out
	Database  config.Database
	Temporal  config.Temporal
	Stripe    config.Stripe
	SendGrid  config.SendGrid
	Receipt   config.Receipt
	Metrics   config.Metrics
	Worker    config.WorkerTuning
	RateLimit config.RateLimit
}

func splitConfig(c *config.Config) configParts {
	return configParts{
		Database: c.Database, Temporal: c.Temporal, Stripe: c.Stripe, SendGrid: c.SendGrid,
		Receipt: c.Receipt, Metrics: c.Metrics, Worker: c.Worker, RateLimit: c.API.RateLimit,
	}
}

// Serve runs app until SIGINT or SIGTERM (or an fx.Shutdowner) asks it to
// stop: it starts it within its start timeout, waits, and stops it within
// its stop timeout, logging any failure with its root cause. It returns the
// process exit code: 0 after a clean stop, 2 when the app failed to build
// or start for bad configuration (an error matching config.ErrInvalid, as
// for a problem config.Load finds), 1 when it failed to build, start or
// stop otherwise, or the exit code a Shutdowner asked for.
func Serve(app *fx.App, logger *slog.Logger) int {
	if err := app.Err(); err != nil {
		logger.Error("cannot build the app", "err", RootCause(err))
		return failedCode(err)
	}
	startCtx, cancel := context.WithTimeout(context.Background(), app.StartTimeout())
	defer cancel()
	if err := app.Start(startCtx); err != nil {
		logger.Error("cannot start", "err", RootCause(err))
		return failedCode(err)
	}
	sig := <-app.Wait()
	logger.Info("stopping", "signal", sig.Signal.String(), "stop_timeout", app.StopTimeout().String())
	stopCtx, cancel := context.WithTimeout(context.Background(), app.StopTimeout())
	defer cancel()
	if err := app.Stop(stopCtx); err != nil {
		logger.Error("unclean stop", "err", err)
		return 1
	}
	logger.Info("stopped")
	return sig.ExitCode
}

// failedCode is the exit code of an app that failed to build or start
// with err: 2 for bad configuration, else 1.
func failedCode(err error) int {
	if errors.Is(RootCause(err), config.ErrInvalid) {
		return 2
	}
	return 1
}

// configError is a configuration problem found while the app builds or
// starts, such as a pool too small for the process or a retention shorter
// than the namespace's: its message is the problem's own, and it matches
// config.ErrInvalid, so that the process exits 2 as for a problem
// config.Load finds.
type configError struct{ err error }

func configErrorf(format string, args ...any) error {
	return &configError{err: fmt.Errorf(format, args...)}
}

func (e *configError) Error() string { return e.err.Error() }

func (e *configError) Unwrap() error { return e.err }

// Is reports whether target is config.ErrInvalid.
func (e *configError) Is(target error) bool { return target == config.ErrInvalid }

// Run starts app, calls fn, and stops app, for a command that does one
// thing and exits. The error is fn's, or the start's
// (reduced to its root cause), or the stop's.
func Run(ctx context.Context, app *fx.App, fn func(ctx context.Context) error) error {
	if err := app.Err(); err != nil {
		return RootCause(err)
	}
	startCtx, cancel := context.WithTimeout(ctx, app.StartTimeout())
	defer cancel()
	if err := app.Start(startCtx); err != nil {
		return RootCause(err)
	}
	err := fn(ctx)
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), app.StopTimeout())
	defer cancel()
	return errors.Join(err, app.Stop(stopCtx))
}

// RootCause strips fx's and dig's wrapping ("could not build arguments for
// function …") from err, leaving the constructor's or hook's own message.
func RootCause(err error) error {
	if err == nil {
		return nil
	}
	return dig.RootCause(err)
}
