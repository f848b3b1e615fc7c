// Package api is keyed's HTTP API: create an order and queue its checkout,
// refund it, and read an order with each of its effects and refunds (routes
// on Handler). Every /v1 request carries a bearer API key that decides the
// tenant; every POST an Idempotency-Key, kept as an effect record. The API
// never calls Temporal: it writes an outbox row in the order's transaction.
//
// api/README.md lists every status; docs/design.md ("Notes moved from the
// code", api) describes idempotency, failures and starts.
package api
