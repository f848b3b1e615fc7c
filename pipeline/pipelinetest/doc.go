// Package pipelinetest helps unit-test a workflow built on package pipeline
// in the SDK's test environment, with its activities mocked: the status
// query and current details (States, Status, Details), the decide update an
// operator would send (Decide), and what the run did (RecordStarted,
// RecordAttention). RequireRefused and RequireVerified serve a pipeline's
// Decider tests. It imports no pipeline's domain.
package pipelinetest
