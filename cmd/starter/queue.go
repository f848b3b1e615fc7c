package main

import (
	"context"
	"fmt"
	"io"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
)

// queueCheckTimeout bounds the look at a task queue: a warning is not worth
// a slow command.
const queueCheckTimeout = 5 * time.Second

// unpolled reports whether no worker has polled queue's workflow tasks
// lately (Temporal remembers pollers for a few minutes); false when
// Temporal cannot be asked.
func unpolled(ctx context.Context, tc client.Client, queue string) bool {
	tq, err := tc.DescribeTaskQueue(ctx, queue, enumspb.TASK_QUEUE_TYPE_WORKFLOW)
	return err == nil && len(tq.GetPollers()) == 0
}

// warnUnpolledQueue warns on w when the open run of workflowID sits on a
// task queue no worker has polled lately: a mistyped --task-queue
// (TEMPORAL_TASK_QUEUE), or workers that are down. A run that collapsed
// into one on another queue than want is named too, since starting again
// cannot move it. It stays silent when Temporal cannot be asked: the start
// itself succeeded.
func warnUnpolledQueue(ctx context.Context, w io.Writer, tc client.Client, workflowID, want string) {
	ctx, cancel := context.WithTimeout(ctx, queueCheckTimeout)
	defer cancel()
	desc, err := tc.DescribeWorkflow(ctx, workflowID, "")
	if err != nil || desc.RawResponse.GetWorkflowExecutionInfo().GetCloseTime() != nil {
		return
	}
	queue := desc.RawResponse.GetWorkflowExecutionInfo().GetTaskQueue()
	if !unpolled(ctx, tc, queue) {
		return
	}
	other := ""
	if queue != want {
		other = fmt.Sprintf(", not on %q: starting it again joins this run and cannot move it", want)
	}
	_, _ = fmt.Fprintf(w, "starter: warning: the run %s is on task queue %q%s, and no worker has polled that queue lately: "+
		"it waits until one does. If the queue is mistyped, terminate the run (temporal workflow terminate --workflow-id %s) "+
		"and start it again with the right --task-queue (TEMPORAL_TASK_QUEUE)\n", workflowID, queue, other, workflowID)
}

// warnRelayQueue warns on w when no worker has polled queue, where a relay
// starts every outbox row that names no queue of its own: a mistyped
// --task-queue (TEMPORAL_TASK_QUEUE) would start them where nothing runs.
func warnRelayQueue(ctx context.Context, w io.Writer, tc client.Client, queue string) {
	ctx, cancel := context.WithTimeout(ctx, queueCheckTimeout)
	defer cancel()
	if unpolled(ctx, tc, queue) {
		_, _ = fmt.Fprintf(w, "starter: warning: no worker has polled task queue %q lately; the runs this relay starts there wait "+
			"until one does. Is --task-queue (TEMPORAL_TASK_QUEUE) the workers' queue?\n", queue)
	}
}
