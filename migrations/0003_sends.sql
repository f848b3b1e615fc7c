-- keyed_sends is the collapse window of the notify package: one row per
-- (tenant, recipient, template, entity) holding the last time a message went
-- out. A send within the window from a different effect key is dropped as a
-- repeat. The recipient is stored only as a SHA-256 digest (of the tenant and
-- the lower-cased address), never as an address: this table is read during
-- incidents, and it needs to recognise a recipient, not to know one.
CREATE TABLE keyed_sends (
    tenant_id        text        NOT NULL,
    recipient_sha256 bytea       NOT NULL CHECK (length(recipient_sha256) = 32),
    template         text        NOT NULL,
    entity           text        NOT NULL,
    -- effect_key is the key of the send that holds the window, so a retry of
    -- that same effect is never collapsed into itself.
    effect_key       text        NOT NULL,
    sent_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, recipient_sha256, template, entity)
);

-- Prune deletes rows whose window has long passed, oldest first.
CREATE INDEX keyed_sends_sent_at_idx ON keyed_sends (sent_at);
