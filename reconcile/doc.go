// Package reconcile compares keyed's charge records with the PaymentIntents
// Stripe holds, and its refund ledger with Stripe's refunds, and reports
// every disagreement.
//
// keyed makes a charge happen once by claiming its effect key in Postgres
// and sending the same key to Stripe as the Idempotency-Key. That is two
// duplicate detectors, and they can disagree: Stripe forgets idempotency
// keys after 24 hours, a record can be pruned or edited by hand, a worker
// can die between Stripe's answer and the stored outcome, a bug can send a
// different key. Neither side can see the disagreement on its own; only a
// reconciliation against the provider finds it.
//
// # What is compared
//
// Run takes a Window of creation times and reads two sides:
//
//   - keyed: every keyed_effects record of kind "charge" created in the
//     window (effects.Client.ListKind), whose stored outcome is an
//     orders.ChargeResult.
//   - Stripe: every PaymentIntent created in the window that carries the
//     metadata effect_key, found with the Search API
//     (created>=from AND created<to, paged through stripe-go's iterator).
//
// They are joined on the effect key. A record whose PaymentIntent is not in
// the search (created just outside the window, or too recent for Stripe's
// search index, which lags about a minute) is fetched by ID; a
// PaymentIntent whose record was created before the window is read by key.
// A claim with a live lease is a charge still running and is skipped
// (Report.InFlight).
//
// # Findings
//
// Each Finding carries the tenant, the effect key, the record's state and
// stored outcome, and Stripe's PaymentIntents for the key (IDs, statuses,
// amounts): outcomes only, never card data, emails or client secrets.
//
//   - KindExtraCharges: two or more succeeded PaymentIntents carry one
//     effect key. The customer was charged more than once: refund every
//     PaymentIntent but the one the record stores.
//   - KindMissingRecord: Stripe has a succeeded PaymentIntent, and keyed has
//     no succeeded record for its key (none, a claim whose owner died, or a
//     failure). Money was taken that keyed does not know about, and the
//     order may be unpaid or failed in keyed's eyes. When the record exists,
//     settle it with `starter resolve --as done` and the PaymentIntent's
//     outcome as --result; with no record at all, the charge was made
//     outside keyed: find out by whom, and refund it if nothing is owed.
//   - KindMismatch: the succeeded record stores a different payment intent
//     ID, amount, currency or status than Stripe's succeeded PaymentIntent
//     for the key. The record is what every replay returns: correct
//     whichever side is wrong.
//   - KindMissingAtProvider: a succeeded record whose PaymentIntent Stripe
//     does not have, or has but not succeeded. keyed believes the order was
//     paid, and it was not.
//
// # Refunds
//
// The refund workflow (package refunds) reserves each refund in the
// append-only refund_ledger, then refunds it at Stripe with its
// refund_stripe effect key ("<tenant>:order:<order>:refund:<refund_id>:refund_stripe")
// as Idempotency-Key and metadata effect_key, and stores Stripe's answer in
// refund_stripe_outcomes. Run compares, joined on that key:
//
//   - keyed: the ledger rows reserved in the window, with their recorded
//     outcomes and the refund_stripe step's effect record.
//   - Stripe: every refund carrying an effect key that Stripe created in
//     the window (GET /v1/refunds with created bounds, paged), plus every
//     refund of the payment intents those refunds and ledger rows are on
//     (GET /v1/refunds?payment_intent=…), so that a refund made outside the
//     window under the same key is seen. A refund whose ledger row was
//     reserved before the window is read by key.
//
// A refund without metadata effect_key is not keyed's, unless it refunds a
// keyed charge (its PaymentIntent carries an effect key): then it was made
// outside keyed and is reported under the charge's key. The refund findings
// are:
//
//   - KindDoubleRefund: two or more Stripe refunds (not failed or canceled)
//     carry one refund's key. The customer got the money back more than
//     once.
//   - KindUnrecordedRefund: Stripe refunded under a key with no ledger row
//     (money out without a record), or refunded a keyed charge without a
//     key, or refunded under a key whose ledger row's step never
//     recorded Stripe's answer and is neither running nor younger than
//     Opts.RefundGrace (the workflow stalled after Stripe refunded).
//   - KindRefundMismatch: the ledger's amount, or the recorded refund ID,
//     amount, currency or payment intent, differs from Stripe's refund, or
//     the refund is on another payment intent than the order's charge.
//   - KindRefundMissingAtProvider: a ledger row with no Stripe refund (or
//     only failed or canceled ones) whose step recorded one, or that was
//     reserved longer than Opts.RefundGrace ago and is not running (its
//     step never ran, or failed for good). keyed shows a refund the
//     customer did not get. A released refund (refund_releases: Stripe
//     refused it and keyed gave its reservation back) with no Stripe
//     refund is not one: that is what its release says.
//   - KindReleasedButRefunded: a released refund that Stripe does show as
//     refunded (a refund under its key that is not failed or canceled):
//     keyed counts as left to refund money the customer got back.
//
// A refund whose step holds a live lease, or that was reserved less than
// the grace (DefaultRefundGrace, an hour) ago and has no recorded answer
// yet, is in flight (Report.InFlight): a lost Stripe answer that the step's
// retry finds and records is never reported.
//
// A charge created under another idempotency key still carries the effect
// key in its metadata, which is how extra charges are found. The record's
// own PaymentIntent is always fetched, so a duplicate made days after the
// charge the record stores (Stripe had forgotten the idempotency key) is
// found in the duplicate's window.
//
// # Running it daily
//
// Run `starter reconcile --since 25h` once a day, from cron or a Kubernetes
// CronJob, with DATABASE_URL, STRIPE_SECRET_KEY (a restricted key with read
// access to PaymentIntents and Refunds is enough) and, for a fake,
// STRIPE_API_BASE. The
// extra hour overlaps the previous run, so a charge that was in flight at
// the end of one window, or straddles its boundary, is checked again by the
// next; the reconciler only reads, so overlap and repeated or concurrent
// runs are harmless. The command exits 0 when the window is clean, 3 when
// there are findings (so the job fails and alerts), 1 when Postgres or
// Stripe failed and 2 for bad input. With --json it prints the Report.
//
// Each successful Run is recorded in keyed_reconcile_runs (migration 0011):
// Last returns the most recent, and `starter doctor` fails when it is older
// than the job's period or missing.
//
// Embedded in a long-running process instead, pass Opts.Registerer: the
// gauge keyed_reconcile_findings{kind} holds the last run's findings, the
// counter keyed_reconcile_findings_total{kind} every run's, and
// keyed_reconcile_last_success_timestamp_seconds when the last run
// completed, for an alert on a job that stopped running.
//
// # Cost
//
// Search returns at most 100 PaymentIntents a request and has its own,
// stricter rate limit (tens of requests a second), so a day of 100,000
// charges takes a thousand requests, run one after another. The client
// built by stripestep.NewClient never retries: a 429 or an outage
// fails the run (exit 1); run it again, with --since and --until naming
// the missed window once the next day has begun. The keyed side is one query over keyed_effects by kind and created_at.
// Refunds cost one list of the window's refunds (100 a page) and one list
// per payment intent with a refund in the window, plus one read of the
// effect records per refund.
package reconcile
