// Package notify is keyed's single sender for irreversible sends: every
// email goes out through Sender.Send, so that the effect claim, the delivery
// policy, the collapse window and the provider look-up are enforced in one
// place.
//
// An email cannot be taken back, and SendGrid has no idempotency key, so the
// provider cannot deduplicate for us. It does keep a record, though: every
// message carries its effect key as the custom argument "effect_key" (and
// the header X-Keyed-Effect-Key), and SendGrid's Email Activity API finds
// the messages sent under it (GET /v3/messages with the query
// (unique_args['effect_key']="<key>"), same API key and base URL). The
// Email Activity API is a paid SendGrid add-on and the API key needs its
// scope; without it every look-up fails with 403 and counts as an outage.
//
// # Settling an unfinished send
//
// Send claims the effect key first. A first attempt (a new claim) posts the
// message. If the connection fails after the request may have been written
// (a timeout, a reset, a lost answer), the attempt returns a transient error
// wrapping ErrUnconfirmed: nothing is declared yet. A failure to connect, or
// an answer of 429, 5xx or 4xx, means the message was not accepted.
//
// Every later attempt that finds an earlier attempt's unfinished claim
// (claim mode reentry, takeover or retry) looks the key up before it may
// send:
//
//   - Found: the effect is completed with SendGrid's message ID (the
//     X-Message-Id part of its msg_id), and nothing is sent.
//   - Not found, and SendGrid may have accepted the earlier attempt's
//     request less than LookupLag ago (its POST started less than the send
//     timeout plus LookupLag ago): a transient error wrapping
//     ErrLookupPending ("waiting for SendGrid's activity index …"), so that
//     Temporal retries with backoff, and the next attempt looks again. The
//     start of the POST is the sent_at of this effect key's collapse-window
//     row, written right before each POST; no row means the earlier attempt
//     never reached the POST (or a definite failure gave the row back), so
//     there is nothing to wait for.
//   - Not found after the lag window: the message is sent, with the same
//     key, custom argument and header.
//   - The look-up fails (unreachable, timeout, 429, 5xx, 401/403): a
//     transient error wrapping ErrLookupFailed until the send timeout plus
//     LookupLag+LookupGiveUp have passed since the POST; then the policy
//     decides. With no
//     row, the look-up is not needed, unless the claim is older than the
//     collapse window (the row may have aged out).
//
// # Delivery policies
//
// The policy is chosen per message type (template) and only matters when
// SendGrid cannot be asked:
//
//   - AtMostOnce (the default): a send is repeated only when SendGrid's
//     index, after the lag window, shows no message under the key. The
//     residual risk of a second copy is a message SendGrid accepted but did
//     not index within LookupLag; the residual risk of no email is a
//     request that never reached SendGrid while the look-up failed for
//     the whole bound: the send then fails with an error wrapping
//     effects.ErrAmbiguous and the record is failed terminally with code
//     "ambiguous" for an operator (see effects.Resolve).
//   - AtLeastOnce: the same look-up runs before any resend, so a lost
//     answer no longer means a second copy. When the look-up keeps failing
//     for the whole bound the message is sent again: the cost is,
//     rarely, a second copy, never a missing email. The same residual risk
//     of an accepted but unindexed message applies.
//
// effects.DoOpts.AtMostOnce, which refuses any re-entry without asking the
// provider, is not used here.
//
// # Collapse window
//
// On top of the claim, a collapse window keyed on (tenant, recipient,
// template, entity) drops a repeat of the same message to the same person
// about the same entity within CollapseWindow (ten minutes by default), even
// when it carries a different effect key: a producer that sent the event
// twice, a re-run after a failure. The window is one atomic
// INSERT … ON CONFLICT … DO UPDATE … WHERE statement on the keyed_sends
// table; a dropped send completes its effect with Result.Collapsed set. The
// window is given back only after a definite "not sent" (failure to
// connect, an answer of 4xx or 5xx), never after ErrUnconfirmed. Because
// its row dates a possible send, the window must be at least the send
// timeout plus LookupLag.
//
// What is stored is the outcome only: the SendGrid message ID and the
// collapsed flag. Addresses are stored as SHA-256 digests, bodies never, and
// neither is logged; nor is the API key, on sends or look-ups.
package notify
