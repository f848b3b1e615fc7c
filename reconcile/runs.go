package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
)

// LastRun is the record of a successful reconciliation run, kept in
// keyed_reconcile_runs (migration 0011) by Reconciler.Run.
type LastRun struct {
	Window         Window    `json:"window"`
	Records        int       `json:"records"`
	PaymentIntents int       `json:"payment_intents"`
	InFlight       int       `json:"in_flight"`
	Findings       int       `json:"findings"`
	FinishedAt     time.Time `json:"finished_at"`
}

// ErrNeverRan is returned by Last when no successful run was ever recorded.
var ErrNeverRan = errors.New("no reconciliation run recorded")

// record stores rep as a successful run.
func record(ctx context.Context, db effects.DB, rep *Report) error {
	_, err := db.Exec(ctx, `INSERT INTO keyed_reconcile_runs
(window_from, window_to, records, payment_intents, in_flight, findings) VALUES ($1, $2, $3, $4, $5, $6)`,
		rep.Window.From, rep.Window.To, rep.Records, rep.PaymentIntents, rep.InFlight, len(rep.Findings))
	if err != nil {
		return fmt.Errorf("record the run in keyed_reconcile_runs: %w", err)
	}
	return nil
}

// Last returns the most recent successful run recorded in db. It returns
// ErrNeverRan when there is none, and the database's error otherwise (such
// as an undefined table when migration 0011 was not applied).
func Last(ctx context.Context, db effects.DB) (*LastRun, error) {
	var r LastRun
	err := db.QueryRow(ctx, `SELECT window_from, window_to, records, payment_intents, in_flight, findings, finished_at
FROM keyed_reconcile_runs ORDER BY finished_at DESC LIMIT 1`).Scan(
		&r.Window.From, &r.Window.To, &r.Records, &r.PaymentIntents, &r.InFlight, &r.Findings, &r.FinishedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNeverRan
	}
	if err != nil {
		return nil, fmt.Errorf("read the last reconciliation run: %w", err)
	}
	return &r, nil
}
