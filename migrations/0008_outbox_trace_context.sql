-- An outbox row carries the trace context of the request that enqueued it
-- (W3C traceparent and tracestate as a JSON object), written in the
-- enqueueing transaction, so that the relay's start continues that trace.
-- NULL when tracing is off or the row predates this migration.
ALTER TABLE keyed_outbox ADD COLUMN trace_context jsonb;
