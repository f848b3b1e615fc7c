-- The outbox becomes generic: a row is a workflow type, a workflow ID, a
-- JSON payload, and optionally a task queue, a tenant and small metadata
-- for the starter (outbox.Request).
--
-- task_queue NULL means the starter's default queue. meta holds what the
-- enqueuer knew for the starter (the order pipeline puts the order's amount
-- there, for the run's summary) as a JSON object of strings. tenant_id
-- becomes optional, since not every workflow belongs to a tenant.
--
-- Rolling deploy: code from before this migration still inserts
-- amount_minor and currency, which stay, so its rows keep committing; the
-- relay starts them as they are (workflow_type, workflow_id and payload
-- already had today's meaning), and the order starter loads the amount of
-- such a row's order instead of reading it from meta. Unsent rows written
-- before this migration get their meta here. A later migration may drop
-- amount_minor and currency once no old code runs.
ALTER TABLE keyed_outbox
    ADD COLUMN task_queue text,
    ADD COLUMN meta       jsonb,
    ALTER COLUMN tenant_id DROP NOT NULL;

UPDATE keyed_outbox
SET meta = jsonb_build_object('amount_minor', amount_minor::text, 'currency', currency)
WHERE sent_at IS NULL AND meta IS NULL AND amount_minor IS NOT NULL AND currency IS NOT NULL;
