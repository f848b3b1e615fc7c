package effects

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// PruneKindOpts configures PruneKind. A nil *PruneKindOpts means all
// defaults.
type PruneKindOpts struct {
	// Retention is how long the kind's finished records are kept. Zero
	// means DefaultRetention. Values under one hour are refused.
	Retention time.Duration
	// BatchSize bounds each DELETE. Zero means 1000.
	BatchSize int
	// ExpiredClaims also deletes claims whose lease ran out more than
	// Retention ago. Set it only for a kind whose effect is a write to the
	// same database, stored with CompleteTx in the effect's own
	// transaction: there a claim whose lease ran out is one whose holder
	// died with its transaction rolled back, so it did nothing. For any
	// other kind an expired claim may still be doing its effect.
	ExpiredClaims bool
}

// pruneKindSQL deletes up to $4 legacy records of kind $1 finished (or,
// when $3, claimed with a lease that ended) more than $2 microseconds ago,
// oldest first (OldestFirstSQL).
var pruneKindSQL = OldestFirstSQL("keyed_effects",
	`class = 'legacy' AND created_at < now() - $2 * interval '1 microsecond' AND kind = $1 AND `+pruneKindWhere, "created_at", 4)

const pruneKindWhere = `(
	(state <> 'claimed' AND finished_at < now() - $2 * interval '1 microsecond')
	OR ($3 AND state = 'claimed' AND lease_until < now() - $2 * interval '1 microsecond'))`

// PruneKind deletes, in batches, the unpartitioned or legacy records of kind
// (as Prune; leaves are dropped by Retire) that finished longer than
// the retention ago (and with ExpiredClaims its long-expired claims), and
// returns how many it deleted. It returns an error for an empty kind, a
// retention under one hour or a failed DELETE, with the count so far.
func (c *Client) PruneKind(ctx context.Context, kind string, opts *PruneKindOpts) (int64, error) {
	if kind == "" {
		return 0, errors.New("prune kind: kind is empty")
	}
	if opts == nil {
		opts = &PruneKindOpts{}
	}
	retention, batch := opts.Retention, opts.BatchSize
	if retention == 0 {
		retention = DefaultRetention
	}
	if retention < time.Hour {
		return 0, fmt.Errorf("prune %s effects: retention %s is under one hour; records must outlive the retry window", kind, retention)
	}
	if batch <= 0 {
		batch = 1000
	}
	total, err := DeleteInBatches(ctx, c.db, batch, pruneKindSQL, kind, retention.Microseconds(), opts.ExpiredClaims)
	if err != nil {
		return total, fmt.Errorf("prune %s effects: %w", kind, err)
	}
	return total, nil
}
