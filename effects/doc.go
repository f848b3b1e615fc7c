// Package effects makes a side effect happen once, however many times the
// code around it runs.
//
// Temporal, like every queue, runs an activity at least once: a worker can do
// the work and die before reporting it, and the only safe reaction is to run
// it again. effects turns that second run into a no-op. Before acting, a step
// claims an effect key in Postgres; after acting, it stores the outcome under
// that key. A second run finds the outcome and returns it instead of acting.
//
// # Effect classes
//
// Not every step needs a key. Classify the side effect first:
//
//   - Absolute write (set a status, upsert by primary key): a repeat writes
//     the same value. No machinery needed.
//   - Relative write (add to a balance, append a row): a repeat doubles it.
//     Use a unique constraint on the source event, or DoTx so that the write
//     and its effect record commit together.
//   - External create (charge a card, buy a label): a repeat costs money.
//     Claim a key here and send the same key to the provider as its
//     idempotency key.
//   - Irreversible send (email, SMS, webhook): a repeat cannot be undone.
//     Claim before sending; choose at-most-once (DoOpts.AtMostOnce) or
//     at-least-once per message type.
//
// # Keys
//
// A Key is a tenant plus business parts, "acme:order:9f3a:charge". It must
// be derived from the business event, so that every attempt computes the
// same key: across restarts, across a replay a week later, across a producer
// that sent twice. Never use a message ID (it changes when the producer
// resends), an attempt number (it changes on every retry, the very case to
// catch) or a UUID generated in the handler. Give each effect its own key,
// "…:charge" and "…:receipt", so a retry after a successful charge and a
// failed email sends only the email. Keys are always scoped to a tenant, so
// one tenant can neither suppress nor read another's effects.
//
// # States
//
// A record is created claimed, with an owner and a lease, and ends
// succeeded (with its outcome), failed_transient or failed_terminal. Claim
// is one INSERT … ON CONFLICT DO NOTHING: an inserted row means the caller
// owns the effect. Otherwise the same statement reads the existing record
// (one round trip either way), and Claim branches:
//
//   - succeeded: the claim is Done and carries the stored outcome; do no work.
//   - claimed, lease live, another owner: *InProgressError (retry later).
//   - claimed, same owner: the same logical step on a later attempt re-enters
//     at once (ModeReentry).
//   - claimed, lease expired: the owner died; one conditional UPDATE takes it
//     over (ModeTakeover), so of many racers exactly one wins.
//   - failed_transient: claimed again (ModeRetry).
//   - failed_terminal: the stored *TerminalError is returned.
//
// Every takeover bumps the record's generation, and Complete, Fail and
// Extend only touch the generation they claimed. An attempt that lost its
// claim gets ErrLeaseLost and must stop. A Fingerprint of the step's inputs
// guards against one key being used for two different requests
// (ErrKeyReused).
//
// # Migrations
//
// effects keeps its records in one table, keyed_effects, created by its own
// migration line: SQL files embedded in the package, numbered from 1, each
// recorded in keyed_effects_migrations once applied. A Migrator applies the
// pending ones in one transaction, under an advisory lock per schema, so
// several processes starting together migrate once. Run it before creating
// a Client, at startup or from a deploy step:
//
//	migrator, err := effects.NewMigrator(pool, nil)
//	if err != nil {
//		return err
//	}
//	if _, err := migrator.Migrate(ctx); err != nil {
//		return err
//	}
//
// MigrateTx runs them in the caller's transaction instead, next to the
// application's own schema changes; Pending lists what Migrate would apply.
// Tables go into the current schema (the first of the search_path), so one
// database can hold several independent sets. A team that runs SQL through
// its own migration tool can take the files from Migrations instead; every
// file is idempotent. Migrations only move forward.
//
// # Adding a keyed step
//
// Do runs the whole branch logic around a function:
//
//	key, err := effects.NewKey(tenant, "order", orderID, "charge")
//	if err != nil {
//		return err
//	}
//	pi, err := effects.Do(ctx, client, effects.ClaimParams{Key: key, Owner: wfID + "/charge"},
//		func(ctx context.Context, claim *effects.Claim) (Charged, error) {
//			return stripeCharge(ctx, claim.Key.String(), amount) // same key to the provider
//		}, nil)
//
// For a database effect, DoTx runs the claim, the caller's writes and the
// completed record in the caller's transaction, so the effect and its record
// commit or roll back together. Claim, Complete and Fail also come as
// ClaimTx, CompleteTx and FailTx, taking the caller's pgx.Tx, and the reads
// Get and List as GetTx and ListTx: a transaction reads through itself and
// never waits for a second pooled connection. When such a
// transaction rolls back, Release gives the key up at once, and a larger
// outcome, such as a stored HTTP response, may raise its own cap with
// ClaimParams.MaxResultBytes.
//
// # Serializing one entity
//
// A claim keeps one effect from happening twice; it does not stop two
// different effects on the same entity from interleaving. When they must
// not, LockEntityTx takes a transaction-scoped advisory lock on the
// entity's key: it releases on commit, rollback or a dead connection, and
// leaves other entities free.
//
// # Errors
//
// Errors are terminal unless marked with Transient: an unclassified failure
// surfaces instead of looping. Branch with errors.Is on ErrInProgress,
// ErrTerminal, ErrKeyReused, ErrLeaseLost, ErrAmbiguous and ErrInvalidKey.
//
// # Outcomes, not payloads
//
// Complete stores an outcome: an ID, a status, an amount. Never card data,
// message bodies or secrets: effect records are read during incidents far
// more often than the tables they protect. Outcomes over MaxResultBytes are
// refused.
//
// # Retention
//
// Prune deletes finished records older than DefaultRetention (30 days), in
// batches, and never a claim. The retention must outlive the longest retry
// window plus the time a failed run may wait for a replay.
//
// # Metrics
//
// NewMetrics registers counters by effect kind: claims acquired (by mode),
// duplicates suppressed, in-progress conflicts, takeovers, fingerprint
// mismatches and failures, a claim-latency histogram, and the age of the
// first claim when a duplicate arrives, which tells what retention the
// records really need. Every outcome is
// also logged with its effect_key through log/slog.
package effects
