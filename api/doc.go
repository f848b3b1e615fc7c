// Package api is keyed's HTTP API: create an order and queue its checkout,
// refund it, and read an order with each of its effects and refunds.
//
//	POST /v1/orders                          create an order and queue its checkout
//	GET  /v1/orders/{id}                     the order, its workflow start, each effect's key, state and outcome, and its refunds
//	POST /v1/orders/{id}/refunds             request a refund of a paid order and queue its run
//	GET  /v1/orders/{id}/refunds/{refund_id} the refund: amount, state, Stripe refund ID, start and effects
//	GET  /healthz                            200 when the database answers, 503 when not
//
// # Authentication
//
// Every /v1 request carries "Authorization: Bearer <API key>". Keys are
// configured per tenant (KeysFrom: KEYED_API_KEYS="acme=sk_…,globex=sk_…"
// or a file named by KEYED_API_KEYS_FILE) and compared in constant time. The
// tenant comes from the key, never from the request. A missing or unknown
// key gets 401 unauthorized.
//
// # Idempotency-Key
//
// POST requires an Idempotency-Key header: 1 to 255 bytes of printable
// ASCII without spaces, such as a UUID, chosen once per logical request and
// sent unchanged on every retry. Keys belong to the authenticated tenant, so
// one tenant can neither replay nor block another's requests. The key may
// come bare, as Stripe sends it, or as an RFC 8941 string, as the IETF
// Idempotency-Key draft sends it: abc and "abc" are one key. Malformed
// quoting, and parameters after the string, get 400.
//
//   - First use: the order, the start request for its workflow (an outbox
//     row) and the response are written in one transaction. 201 when the
//     order was created, 200 when an identical order already existed.
//   - Same key, same request: the first response, same status and same
//     body byte for byte, with "Idempotent-Replayed: true".
//   - Same key, different request (compared by a SHA-256 of the canonical
//     request, so member order and whitespace do not count): 422
//     idempotency_key_reused.
//   - Same key while the first request still runs: 409 request_in_progress
//     with Retry-After.
//
// Each key is an effect record of kind KindAPIRequest, claimed, completed
// and released through package effects like any keyed step, under an
// effect key of the tenant. Only successful responses are stored, for
// Retention (24 hours) at least, and as outcomes, not bodies: the record
// keeps the status and what the server decided (an order's status and
// times, a refund's state, start and effects), and a replay renders the
// body again from it and the retried request, so no customer email or
// refund reason is kept in keyed_effects.
// A request that fails (bad input, order_conflict, a database error) writes
// nothing, releases its key on a fresh context bounded by ReleaseTimeout,
// and may be retried with the same key at once. Bad input gets 400 (413 for
// a body over 64 KiB, 408 for a body slower than the server's read timeout)
// with a JSON error naming the field: {"error":{"code":…,"field":…,"message":…}}.
// Input is strict: a member sent twice or in another case, a non-ASCII
// currency and a second Authorization header are refused, and the customer
// email must pass orders.ValidateEmail.
//
// # Failures
//
// Every database call of a request, the Idempotency-Key claim included,
// runs under HandlerOpts.RequestTimeout. A database that is down, stalled
// or shutting down gets 503 unavailable with Retry-After; any other
// failure 500 internal. Neither shows its cause, and GET shows failed
// starts and effects as stable codes with plain messages: the stored
// errors (a Temporal dial error, an operator's resolve reason) go to logs
// and operator commands only. api/README.md lists every status; a test
// drives the server through that table.
//
// # Starting workflows
//
// The API never calls Temporal. It writes an outbox row in the order's
// transaction, and an outbox.Relay, running in the worker or alone, starts
// the workflow under its business-derived ID. So a crash between the
// commit and the start delays the start; it never loses it, and a rollback
// never starts anything.
package api
