package orders

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
)

// Effects returns the order's effect records under prefix (claims.List),
// in the order they were made, with a succeeded record, outcome {"status":
// the state moved to}, for each transition under a key that has no
// finished record: a self-guarded step's transition is its record
// (step.Declaration.SelfGuarded), and it outranks an older worker's
// unfinished claim of that key.
func (s *Store) Effects(ctx context.Context, claims *effects.Client, prefix effects.Key) ([]*effects.Record, error) {
	recs, err := claims.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	return withTransitions(ctx, s.db, prefix, recs)
}

// EffectsTx is Effects in the caller's transaction.
func (s *Store) EffectsTx(ctx context.Context, tx pgx.Tx, claims *effects.Client, prefix effects.Key) ([]*effects.Record, error) {
	recs, err := claims.ListTx(ctx, tx, prefix)
	if err != nil {
		return nil, err
	}
	return withTransitions(ctx, tx, prefix, recs)
}

// withTransitions adds to recs a record for each transition of prefix's
// order whose event ID is a key under prefix that recs lack or hold
// unfinished.
func withTransitions(ctx context.Context, db effects.DB, prefix effects.Key, recs []*effects.Record) ([]*effects.Record, error) {
	parts := prefix.Parts()
	if len(parts) != 2 || parts[0] != "order" {
		return recs, nil
	}
	rows, err := db.Query(ctx, `SELECT event_id, to_state, created_at FROM order_transitions
WHERE tenant_id = $1 AND order_id = $2 AND starts_with(event_id, $3) ORDER BY created_at, event_id`,
		prefix.Tenant(), parts[1], prefix.String()+effects.Separator)
	if err != nil {
		return nil, fmt.Errorf("list transitions of %s: %w", prefix, err)
	}
	type transition struct {
		event, to string
		at        time.Time
	}
	ts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (transition, error) {
		var t transition
		return t, r.Scan(&t.event, &t.to, &t.at)
	})
	if err != nil {
		return nil, fmt.Errorf("list transitions of %s: %w", prefix, err)
	}
	added := false
	for _, t := range ts {
		i := slices.IndexFunc(recs, func(r *effects.Record) bool { return r.Key == t.event })
		if i >= 0 && recs[i].State == effects.StateSucceeded {
			continue
		}
		rec, err := transitionRecord(prefix.Tenant(), t.event, t.to, t.at)
		if err != nil {
			return nil, err
		}
		if i >= 0 {
			// An older worker's unfinished claim of a step that is now
			// self-guarded: the transition under its key proves the write.
			recs[i] = rec
			continue
		}
		recs, added = append(recs, rec), true
	}
	if added {
		slices.SortStableFunc(recs, func(a, b *effects.Record) int { return a.CreatedAt.Compare(b.CreatedAt) })
	}
	return recs, nil
}

// transitionRecord is the record of a self-guarded step whose transition
// under key moved the order to `to` at `at`.
func transitionRecord(tenant, key, to string, at time.Time) (*effects.Record, error) {
	result, err := json.Marshal(map[string]string{"status": to})
	if err != nil {
		return nil, fmt.Errorf("encode transition %s: %w", key, err)
	}
	return &effects.Record{Key: key, TenantID: tenant, Kind: key[strings.LastIndex(key, effects.Separator)+1:],
		State: effects.StateSucceeded, Attempts: 1, Result: result, CreatedAt: at, UpdatedAt: at, FinishedAt: &at}, nil
}
