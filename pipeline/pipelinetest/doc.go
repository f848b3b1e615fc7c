// Package pipelinetest helps unit-test a workflow built on package pipeline
// in the Temporal SDK's test environment (go.temporal.io/sdk/testsuite),
// with its activities mocked: what the status query and the current details
// say, the decide update an operator would send, and what the run did along
// the way (the activities it started, the values it gave KeyedAttention).
//
// A test makes the environment with NewEnv, records with RecordStarted and
// RecordAttention before it runs the workflow, schedules decisions with
// Decide, and reads the run with States, Status and Details, from a delayed
// callback while the run waits or after it finished:
//
//	env := pipelinetest.NewEnv(t)
//	// Register the workflow, its activities and ApplyDecision; mock them.
//	attention := pipelinetest.RecordAttention(env)
//	var during []string
//	env.RegisterDelayedCallback(func() { during = pipelinetest.States(t, env) }, time.Hour)
//	u := pipelinetest.Decide(env, pipeline.Decision{Step: "receipt", Resolution: effects.ResolveRetry,
//		By: "ada", Reason: "not in SendGrid"}, 2*time.Hour)
//	env.ExecuteWorkflow(orders.WorkflowName, in)
//	require.NoError(t, u.Err())
//	require.Equal(t, []string{"receipt:ambiguous", pipelinetest.Unset}, attention.Values())
//
// A pipeline's Decider tests (against a real Postgres and the providers'
// fakes) check its steps' refusals with RequireRefused, and that every
// step declares its done outcome and verifies it with RequireVerified.
//
// The package imports no keyed package but pipeline, orders, activities and
// effects, so a pipeline of your own can use it as it is.
package pipelinetest
