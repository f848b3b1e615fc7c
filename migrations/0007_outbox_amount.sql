-- An outbox row carries its order's amount, copied in the enqueueing
-- transaction, so that the relay can put it in the run's static summary
-- without loading the order before each start. Rows enqueued before this
-- migration, or for an order not in the database, leave both NULL.
ALTER TABLE keyed_outbox
    ADD COLUMN amount_minor bigint,
    ADD COLUMN currency     text;
