// Package reconcile compares keyed's charge records with the PaymentIntents
// Stripe holds, and its refund ledger with Stripe's refunds, and reports
// every disagreement: keyed's effect records and Stripe's idempotency keys
// are two duplicate detectors, and only a reconciliation against the
// provider sees where they disagree.
//
// What is compared, the finding kinds and how to run it are described in
// docs/design.md ("Notes moved from the code", reconcile).
package reconcile
