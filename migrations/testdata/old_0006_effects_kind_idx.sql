-- Reconciliation reads one kind of effect (charges) created in a window.
CREATE INDEX keyed_effects_kind_created_idx ON keyed_effects (kind, created_at);
