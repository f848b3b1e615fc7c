// Package notify is keyed's single sender for irreversible sends: every
// email goes out through Sender.Send, so that the effect claim, the delivery
// policy (AtMostOnce or AtLeastOnce per template), the collapse window and
// the SendGrid Email Activity look-up that settles an unfinished send are
// enforced in one place. Only outcomes are stored: the message ID, the
// collapsed flag and SHA-256 digests of addresses.
//
// How an unfinished send is settled, the policies' residual risks and the
// collapse window are described in docs/design.md ("Notes moved from the
// code", notify).
package notify
