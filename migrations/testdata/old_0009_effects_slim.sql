-- Slimmer effect records (issue 11).
--
-- Keys begin with the tenant, so the primary key already orders a tenant's
-- records together: with the key in the "C" collation (byte order; keys are
-- ASCII) the primary key serves List's prefix scan, and the tenant index,
-- the largest after the primary key, goes.
--
-- Completing a claim changed two indexed columns (state and finished_at, in
-- the finished index and its predicate), so every Complete, Fail and
-- takeover was a non-HOT update writing a new entry into every index. Prune
-- now walks records by created_at (a record finishes after it is created,
-- so every record finished before the cutoff was created before it) and
-- ListKind reads the same index, filtering kind inside it: no index covers a
-- column that Complete, Fail, Extend or a takeover changes, so those updates
-- are HOT whenever the row's page has room (it usually does: a step completes
-- its claim milliseconds after inserting it, and page pruning frees the old
-- version), and they write no index entry at all.
--
-- Changing the collation rebuilds the primary key under an exclusive lock:
-- seconds per million records.
ALTER TABLE keyed_effects ALTER COLUMN key TYPE text COLLATE "C";
DROP INDEX keyed_effects_tenant_idx;
DROP INDEX keyed_effects_finished_idx;
DROP INDEX keyed_effects_kind_created_idx;
CREATE INDEX keyed_effects_created_idx ON keyed_effects (created_at, kind);
