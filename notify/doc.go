// Package notify is keyed's single sender for irreversible sends: every
// email goes out through Sender.Send, so that the effect claim, the delivery
// policy and the collapse window are enforced in one place.
//
// An email cannot be taken back, and SendGrid has no idempotency key, so the
// provider cannot deduplicate for us. Recording the send before or after it
// happens is wrong in one direction each, and the choice is made per message
// type (template):
//
//   - AtMostOnce (the default): the effect key is claimed before sending. If
//     an attempt dies after the claim, a later attempt does not send again;
//     it returns an error wrapping effects.ErrAmbiguous and leaves the record
//     failed with code "ambiguous" for an operator. A timeout or a dropped
//     connection after the request went out is ambiguous in the same way.
//     The cost is, rarely, an email nobody received.
//   - AtLeastOnce: the effect is marked done only after SendGrid accepted
//     the message. An attempt that dies in between is repeated, so the cost
//     is, rarely, a second copy.
//
// On top of the claim, a collapse window keyed on (tenant, recipient,
// template, entity) drops a repeat of the same message to the same person
// about the same entity within CollapseWindow (ten minutes by default), even
// when it carries a different effect key: a producer that sent the event
// twice, a re-run after a failure. The window is one atomic
// INSERT … ON CONFLICT … DO UPDATE … WHERE statement on the keyed_sends
// table; a dropped send completes its effect with Result.Collapsed set.
//
// The effect key travels with the message, as the SendGrid custom argument
// "effect_key" and the header X-Keyed-Effect-Key, so that a delivered email
// can be traced back to its effect record.
//
// What is stored is the outcome only: the SendGrid message ID and the
// collapsed flag. Addresses are stored as SHA-256 digests, bodies never, and
// neither is logged; nor is the API key.
package notify
