package fxapp

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	stripeclient "github.com/stripe/stripe-go/v76/client"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.uber.org/fx"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
	orderflow "github.com/keyedhq/keyed/workflows/order"
	refundflow "github.com/keyedhq/keyed/workflows/refund"
)

// WorkerModule provides the order activities, the refund activities and a
// Temporal worker on the configured task queue with the order and refund
// workflows and every activity registered, ApplyDecision (an operator's
// decide update) included. The worker starts
// polling in OnStart, after Postgres is up and migrated; in OnStop it stops
// polling and waits up to WORKER_STOP_TIMEOUT for in-flight activities, which
// then see their context cancelled. A fatal worker error (such as the
// namespace disappearing) shuts the app down with exit code 1 instead of
// leaving a process that polls nothing.
var WorkerModule = fx.Module("worker",
	fx.Provide(newActivities, newRefundActivities, newWorker),
	fx.Invoke(func(worker.Worker) {}),
)

type activitiesIn struct {
	fx.In
	Pool    *pgxpool.Pool
	Effects *effects.Client
	Orders  *orders.Store
	Stripe  *stripeclient.API
	Sender  *notify.Sender
	Logger  *slog.Logger
}

func newActivities(in activitiesIn) (*ordersteps.Activities, error) {
	return ordersteps.New(ordersteps.Deps{
		DB: in.Pool, Effects: in.Effects, Orders: in.Orders, Stripe: in.Stripe, Sender: in.Sender,
		Logger: in.Logger.With("component", "activities"),
	})
}

func newRefundActivities(in activitiesIn) (*refundsteps.Activities, error) {
	return refundsteps.New(refundsteps.Deps{
		DB: in.Pool, Effects: in.Effects, Orders: in.Orders, Stripe: in.Stripe, Sender: in.Sender,
		Logger: in.Logger.With("component", "refunds"),
	})
}

type workerIn struct {
	fx.In
	Lifecycle  fx.Lifecycle
	Shutdowner fx.Shutdowner
	Client     client.Client
	Temporal   config.Temporal
	Tuning     config.WorkerTuning
	Activities *ordersteps.Activities
	Refunds    *refundsteps.Activities
	Effects    *effects.Client
	Logger     *slog.Logger
}

// WorkerOptions returns the Temporal worker options of t: the activity
// slots (WORKER_MAX_ACTIVITIES), the workflow-task and activity-task
// pollers (WORKER_POLLERS) and the drain time (WORKER_STOP_TIMEOUT).
func WorkerOptions(t config.WorkerTuning) worker.Options {
	return worker.Options{
		MaxConcurrentActivityExecutionSize: t.MaxConcurrentActivities,
		MaxConcurrentWorkflowTaskPollers:   t.Pollers,
		MaxConcurrentActivityTaskPollers:   t.Pollers,
		WorkerStopTimeout:                  t.StopTimeout,
	}
}

func newWorker(in workerIn) (worker.Worker, error) {
	logger := in.Logger.With("component", "worker", "task_queue", in.Temporal.TaskQueue)
	opts := WorkerOptions(in.Tuning)
	opts.OnFatalError = func(err error) {
		logger.Error("temporal worker stopped on a fatal error", "err", err)
		_ = in.Shutdowner.Shutdown(fx.ExitCode(1))
	}
	w := worker.New(in.Client, in.Temporal.TaskQueue, opts)
	orderflow.RegisterWithOpts(w, &orderflow.WorkflowOpts{DecisionTimeout: in.Tuning.DecisionTimeout})
	steps := append(in.Activities.Definitions(), in.Refunds.Definitions()...)
	// The decider checks an operator's "done" with every step's declared
	// outcome and its Verify against the provider.
	decider, err := pipeline.NewDecider(in.Effects, steps...)
	if err != nil {
		return nil, fmt.Errorf("decision activity: %w", err)
	}
	refundflow.RegisterWithOpts(w, &pipeline.Opts{DecisionTimeout: in.Tuning.DecisionTimeout})
	// One Register call for both pipelines, so that it refuses a name or an
	// effect key step that an order and a refund activity both claim.
	if err := step.Register(w, append(steps, decider.Definition())...); err != nil {
		return nil, fmt.Errorf("register activities: %w", err)
	}
	in.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			// A clear error for the commonest misconfiguration, before the
			// SDK's own start, which does not take a context.
			if _, err := in.Client.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
				return fmt.Errorf("cannot reach Temporal at %s: %w", in.Temporal.Address, err)
			}
			if err := w.Start(); err != nil {
				return fmt.Errorf("start worker on namespace %q, task queue %q: %w", in.Temporal.Namespace, in.Temporal.TaskQueue, err)
			}
			logger.Info("worker polling", "namespace", in.Temporal.Namespace, "address", in.Temporal.Address)
			return nil
		},
		OnStop: func(ctx context.Context) error {
			logger.Info("worker draining", "stop_timeout", in.Tuning.StopTimeout.String())
			done := make(chan struct{})
			go func() {
				w.Stop() // waits for in-flight activities up to WorkerStopTimeout
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
