// Package pipeline is the workflow side and the operator side of running
// keyed steps, for every pipeline: a Run gives a workflow the status query,
// the current details and waiting for an operator's Decision when a step's
// outcome cannot be known; a Spec registers a pipeline once for the worker,
// the relay, doctor and the starter to iterate. It imports no pipeline's
// domain (a test enforces it).
package pipeline
