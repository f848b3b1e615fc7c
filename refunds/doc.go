// Package refunds is keyed's second workflow: refunds of paid orders, in
// part or in full, built only from packages a user of keyed can import
// (effects, activities' declarations, helper and error types, notify,
// orders). Each activity is an step.Keyed[RefundInput, T], whose
// Run validates the input, derives the key, claims it as the declared class
// requires, logs and maps errors, so that the activity's body is only its
// effect.
//
// RefundWorkflow, whose ID derives from the refund ("refund:<tenant>:
// <order>:<refund_id>", so duplicate starts collapse), runs four keyed
// activities, each with its own effect key
// "<tenant>:order:<order>:refund:<refund_id>:<step>":
//
//  1. Reserve (absolute write + ledger): under a per-order lock, checks that
//     the order was paid and that its amount minus the ledger's sum covers
//     the refund, and appends the refund to the ledger; a refund that does
//     not fit fails terminally (InvalidState) with nothing written and no
//     Stripe call.
//  2. RefundAtStripe (external create): a Stripe refund against the order's
//     PaymentIntent with the effect key as Idempotency-Key and metadata,
//     looked up by metadata first after a re-entry or takeover.
//  3. MarkRefunded (absolute write + unique transition): the order becomes
//     refunded when its refunds confirmed by Stripe (those with a recorded
//     Stripe refund, not the reservations: a refund in flight does not
//     count yet) sum to its amount, partially_refunded otherwise; the last
//     refund's mark sets the final status.
//  4. SendRefundEmail (irreversible send through notify, template "refund",
//     at most once by default).
//
// The ledger (Ledger, table refund_ledger) is append-only: what an order
// has refunded is always the sum of its rows, never a column updated in
// place, and the primary key (tenant, order, refund) makes a repeated
// reservation a no-op instead of a second debit. A refund's amount and
// reason travel in its RefundInput (they are the event's immutable
// parameters, and there is no row before Reserve); Reserve copies them into
// the ledger, and every later step reads the ledger row.
//
// RefundWorkflow runs its steps through pipeline.Run, as the order workflow
// does: the status query and current details show each step, and a step
// whose outcome keyed cannot know (an ambiguous refund email, a reused key,
// a RefundAtStripe whose retries ran out) does not fail the run but waits,
// with the KeyedAttention search attribute set (such as
// "refund_email:ambiguous"), for an operator's decision sent as the
// "decide" update (pipeline.SendDecision, or `starter resolve` with the
// step's effect key, which WorkflowIDOfKey maps to the refund's run). A
// known failure (a refund that exceeds the charge, an order not paid,
// Stripe's refusal) still fails the run. The waiting sits behind the
// workflow.GetVersion change "wait-for-decision", so a refund run that
// failed on an unknown outcome before replays unchanged (testdata). A
// worker running RefundWorkflow registers pipeline's ApplyDecision once
// (workflows.RegisterActivities does); RegisterWithOpts sets the decision
// timeout.
//
// A refund Stripe refuses for good (RefundAtStripe fails with
// ProviderRejected, such as charge_disputed) gives its reservation back:
// the workflow runs a fifth keyed activity, ReleaseRefund (absolute write,
// step "refund_release", behind the workflow.GetVersion change
// "release-on-refusal"), which appends the refund's amount and Stripe's
// refusal code to refund_releases, append-only as the ledger is, and then
// the run still fails with Stripe's error. What an order's refunds hold of
// its charge is always its ledger's sum minus its releases'
// (Ledger.ReservedTx: Reserve's check, RequestTx), so the released part of
// the charge can be refunded under a new refund ID; what it has refunded is
// the sum of its refunds whose Stripe refund is recorded
// (Ledger.ConfirmedTx: MarkRefunded's status). A released refund was never
// confirmed, so its release leaves the status as it is, save for
// correcting one an earlier keyed set from reservations. An unknown outcome (waiting for a
// decision) or a decision timeout releases nothing: Stripe may have
// refunded.
package refunds
