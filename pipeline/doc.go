// Package pipeline is the workflow side of running keyed steps, shared by
// every pipeline (the order workflow in package workflows, the refund
// workflow in package refunds, and a pipeline of your own): the step
// status, the current details, and waiting for an operator when a step's
// outcome cannot be known. It imports only packages a user of keyed can
// import (activities, effects, orders), so that any pipeline can use it.
//
// # Running steps
//
// A workflow builds one Run from its input, any Keyer (a value that
// derives each step's effect key, such as orders.OrderInput or
// refunds.RefundInput), and the declarations of the steps it shows from
// the start (New). New registers the status query (orders.QueryStatus,
// answered with []orders.StepStatus: each step's State*, effect key and
// one-line error) and the UpdateDecide update. RunStep (or Run.Step) runs
// one declared step (step.Declaration) with its declared options and
// the run's input; Run keeps the run's current details
// (workflow.SetCurrentDetails) as short markdown with each step's state,
// effect key and outcome ID in backticks.
//
// # Waiting for a decision
//
// A step that fails with a known outcome (a decline, an invalid state, a
// provider's refusal) fails the run with one line naming the error type,
// step, effect key and what to do, and the later steps are StateSkipped. A
// step that ends with an outcome keyed cannot know (Ambiguous, KeyReused,
// or retries that ran out: Transient, InProgress, LeaseLost, a timeout)
// does not fail the run: the step is StateWaiting, the KeyedAttention
// search attribute (SearchAttrAttention) names it as "<step>:<reason>",
// such as "receipt:ambiguous" or "refund_email:ambiguous", the current
// details say what to decide, and the run waits up to its decision timeout
// (Opts, DefaultDecisionTimeout) for a Decision sent as the UpdateDecide
// ("decide") update. The update's validator (CheckDecision) refuses a bad
// decision before it enters history, naming every problem: a "done" must
// carry the step's outcome, which the step's declared rule
// (step.Declaration.Outcome) decodes and validates. An accepted one
// runs the ApplyDecision activity (Decider): it checks a "done" against the
// provider's record with the step's Verify (from the Definitions the
// Decider was made with) and refuses it, saying why, when the record
// contradicts it or cannot be read (unless the decision says Unverified),
// or when the step refused for good; otherwise it resolves the decided
// record through effects.Resolve, and the step runs again in the same run:
// after "done" it returns the stored outcome, after "retry" it acts. With no decision in
// time the run fails with a non-retryable ErrTypeDecisionTimeout error and
// counts MetricDecisionTimeouts. Waiting sits behind the workflow.GetVersion
// change "wait-for-decision", so a run that failed on an unknown outcome
// before it replays unchanged.
//
// Every worker of a workflow that uses Run registers ApplyDecision exactly
// once (Decider.Definition, DeclDecision), whichever pipelines it runs,
// from a Decider made with every pipeline's Definitions (NewDecider).
//
// # Operating
//
// ListAttention lists every run waiting for a decision, of any pipeline
// (AttentionQuery, "KeyedAttention IS NOT NULL"); AttentionOf says what the
// run of one workflow ID waits for; SendDecision sends it a Decision and
// waits until it is applied. ErrNotWaiting means the run waits for nothing.
//
// # Testing
//
// Package pipelinetest helps a workflow unit test (go.temporal.io/sdk/testsuite)
// of a pipeline: NewEnv, the status query and current details as strings
// (States, Details), Decide to send the decide update later in the run,
// RecordAttention and MockApplyDecision.
package pipeline
