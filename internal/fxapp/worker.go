package fxapp

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/slotshare"
	"github.com/keyedhq/keyed/step"
)

// WorkerModule provides a Temporal worker on the configured task queue
// with every pipeline's workflow and steps registered, ApplyDecision
// included, over the database, the effects client and the providers. The
// worker starts polling in OnStart; in OnStop it stops polling and waits up
// to WORKER_STOP_TIMEOUT for in-flight activities. A fatal worker error
// shuts the app down with exit code 1.
var WorkerModule = fx.Module("worker",
	fx.Provide(newWorker),
	fx.Invoke(func(worker.Worker) {}),
)

type workerIn struct {
	fx.In
	Lifecycle  fx.Lifecycle
	Shutdowner fx.Shutdowner
	Client     client.Client
	Temporal   config.Temporal
	Tuning     config.WorkerTuning
	Stripe     config.Stripe
	SendGrid   config.SendGrid
	Pool       *pgxpool.Pool
	Effects    *effects.Client
	Logger     *slog.Logger
	Pipelines  []pipeline.Spec
	Providers  []any                 `group:"providers"`
	Registerer prometheus.Registerer `optional:"true"`
}

// WorkerOptions returns the SDK worker options of the settings: up to
// WORKER_POLLERS pollers per task type, with the workflow-task pollers in
// the SDK's two-queue behaviour, which always keeps a poll on the task
// queue beside the sticky one (docs/design.md, "No minute-long stalls").
func WorkerOptions(t config.WorkerTuning) worker.Options {
	return worker.Options{
		MaxConcurrentActivityExecutionSize: t.MaxConcurrentActivities,
		WorkflowTaskPollerBehavior: worker.NewPollerBehaviorAutoscaling(worker.PollerBehaviorAutoscalingOptions{
			InitialNumberOfPollers: max(t.Pollers/2, 1), MinimumNumberOfPollers: 1, MaximumNumberOfPollers: t.Pollers,
		}),
		MaxConcurrentActivityTaskPollers: t.Pollers,
		WorkerStopTimeout:                t.StopTimeout,
	}
}

// newShares returns n slot-share limiters, one for each of a process's
// workers (its slots are its own), with their refusals counted in
// keyed_worker_over_share_total when reg is not nil.
func newShares(t config.WorkerTuning, reg prometheus.Registerer, n int) ([]*slotshare.Limiter, error) {
	shares := make([]*slotshare.Limiter, n)
	for i := range shares {
		l, err := slotshare.New(&slotshare.Opts{Slots: t.MaxConcurrentActivities, Share: t.TenantShare})
		if err != nil {
			return nil, configErrorf("WORKER_TENANT_SHARE: %v", err)
		}
		shares[i] = l
	}
	if reg == nil {
		return shares, nil
	}
	refused := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "keyed_worker_over_share_total",
		Help: "Activity attempts refused because their tenant held its share of the worker's slots (WORKER_TENANT_SHARE); each is retried.",
	}, func() float64 {
		var n int64
		for _, l := range shares {
			n += l.Refused()
		}
		return float64(n)
	})
	if err := reg.Register(refused); err != nil {
		return nil, fmt.Errorf("register keyed_worker_over_share_total: %w", err)
	}
	return shares, nil
}

// newGate returns the worker's step.LocalGate, with its refusals counted
// in keyed_worker_first_attempts_queued_total when reg is not nil.
func newGate(t config.WorkerTuning, reg prometheus.Registerer, queued []string) (*step.LocalGate, error) {
	gate, err := step.NewLocalGate(t.MaxConcurrentActivities, t.TenantShare, queued)
	if err != nil {
		return nil, configErrorf("WORKER_TENANT_SHARE: %v", err)
	}
	if reg == nil {
		return gate, nil
	}
	refused := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "keyed_worker_first_attempts_queued_total",
		Help: "First attempts of steps the worker did not run in the workflow task (a provider bound, its activity slots or the tenant's share); each step then ran as an activity.",
	}, func() float64 { return float64(gate.Refused()) })
	if err := reg.Register(refused); err != nil {
		return nil, fmt.Errorf("register keyed_worker_first_attempts_queued_total: %w", err)
	}
	return gate, nil
}

// ProviderRates returns each provider's bound on calls per second across
// all workers on taskQueue: its setting, its steps' task queue (taskQueue
// + "-" + provider) and the rate, 0 when unbounded.
func ProviderRates(taskQueue string, s config.Stripe, g config.SendGrid) []doctor.ProviderRate {
	return []doctor.ProviderRate{
		{Provider: stripestep.Provider, Setting: "STRIPE_CALLS_PER_SECOND", TaskQueue: taskQueue + "-" + stripestep.Provider, PerSecond: s.CallsPerSecond},
		{Provider: notify.Provider, Setting: "SENDGRID_CALLS_PER_SECOND", TaskQueue: taskQueue + "-" + notify.Provider, PerSecond: g.CallsPerSecond},
	}
}

// registerProviderSteps registers on w every step of specs that calls
// provider, and no workflow.
func registerProviderSteps(w worker.Worker, specs []pipeline.Spec, deps pipeline.Deps, provider string) error {
	defs, err := pipeline.Definitions(specs, deps)
	if err != nil {
		return err
	}
	var mine []step.Definition
	for _, d := range defs {
		if d.Provider == provider {
			mine = append(mine, d)
		}
	}
	return step.Register(w, mine...)
}

func newWorker(in workerIn) (worker.Worker, error) {
	logger := in.Logger.With("component", "worker", "task_queue", in.Temporal.TaskQueue)
	opts := WorkerOptions(in.Tuning)
	opts.OnFatalError = func(err error) {
		logger.Error("temporal worker stopped on a fatal error", "err", err)
		_ = in.Shutdowner.Shutdown(fx.ExitCode(1))
	}
	var limits []doctor.ProviderRate
	var queued []string // providers whose first attempts go to their queue
	popts := &pipeline.Opts{DecisionTimeout: in.Tuning.DecisionTimeout}
	for _, l := range ProviderRates(in.Temporal.TaskQueue, in.Stripe, in.SendGrid) {
		if l.PerSecond <= 0 {
			continue
		}
		limits = append(limits, l)
		queued = append(queued, l.Provider)
		if popts.ProviderQueues == nil {
			popts.ProviderQueues = map[string]string{}
		}
		popts.ProviderQueues[l.Provider] = l.TaskQueue
	}
	shares, err := newShares(in.Tuning, in.Registerer, 1+len(limits))
	if err != nil {
		return nil, err
	}
	base := slices.Clip(opts.Interceptors)
	opts.Interceptors = append(base, shares[0])
	w := worker.New(in.Client, in.Temporal.TaskQueue, opts)
	gate, err := newGate(in.Tuning, in.Registerer, queued)
	if err != nil {
		return nil, err
	}
	deps := pipeline.Deps{DB: in.Pool, Effects: in.Effects, Logger: in.Logger.With("component", "steps"), Providers: in.Providers, Gate: gate}
	// One registration for every pipeline, so that no two steps claim one
	// name or key step, and one Decider that checks each step's "done".
	if err := pipeline.Register(w, in.Pipelines, deps, popts); err != nil {
		return nil, fmt.Errorf("register the pipelines: %w", err)
	}
	// Each bounded provider's steps run on its own queue, polled by an
	// activity-only worker that sets the queue's rate limit.
	ws := []worker.Worker{w}
	for i, l := range limits {
		po := opts
		po.Interceptors = append(base, shares[1+i])
		po.DisableWorkflowWorker = true
		po.TaskQueueActivitiesPerSecond = l.PerSecond
		pw := worker.New(in.Client, l.TaskQueue, po)
		if err := registerProviderSteps(pw, in.Pipelines, deps, l.Provider); err != nil {
			return nil, fmt.Errorf("register the %s steps on %s: %w", l.Provider, l.TaskQueue, err)
		}
		ws = append(ws, pw)
		logger.Info("provider calls bounded", "provider", l.Provider, "provider_queue", l.TaskQueue, "per_second", l.PerSecond)
	}
	in.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			// A clear error for the commonest misconfiguration, before the
			// SDK's own start, which does not take a context.
			if _, err := in.Client.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
				return fmt.Errorf("cannot reach Temporal at %s: %w", in.Temporal.Address, err)
			}
			for i, x := range ws {
				if err := x.Start(); err != nil {
					for _, started := range ws[:i] {
						started.Stop()
					}
					return fmt.Errorf("start worker on namespace %q, task queue %q: %w", in.Temporal.Namespace, in.Temporal.TaskQueue, err)
				}
			}
			logger.Info("worker polling", "namespace", in.Temporal.Namespace, "address", in.Temporal.Address)
			return nil
		},
		OnStop: func(ctx context.Context) error {
			logger.Info("worker draining", "stop_timeout", in.Tuning.StopTimeout.String())
			done := make(chan struct{})
			go func() {
				var wg sync.WaitGroup
				for _, x := range ws {
					wg.Go(x.Stop) // waits for in-flight activities up to WorkerStopTimeout
				}
				wg.Wait()
				close(done)
			}()
			select {
			case <-done:
				logger.Info("worker stopped")
				return nil
			case <-ctx.Done():
				return fmt.Errorf("worker did not stop in time: %w", ctx.Err())
			}
		},
	})
	return w, nil
}
