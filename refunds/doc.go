// Package refunds is the refund domain: a refund's versioned input and
// effect keys, the append-only ledger of what an order's refunds reserved,
// released and had confirmed by Stripe, the request that queues a refund's
// run in the outbox, and the steps' outcome types. The steps are in
// activities/refund, the workflow in workflows/refund.
package refunds
