package notify

// ClaimParamsFor returns the claim Send makes for m, so that tests can leave
// a claim behind as a crashed attempt would.
func ClaimParamsFor(m Message) (key, kind, owner, fp string) {
	rcpt := recipientDigest(m.Key.Tenant(), m.To)
	return m.Key.String(), m.Template, m.Owner, fingerprint(m.Template, rcpt, m.Entity)
}

// RecipientDigest returns the recipient digest of m's collapse-window row,
// so that tests can leave a row behind as an attempt that died would.
func RecipientDigest(m Message) []byte {
	return recipientDigest(m.Key.Tenant(), m.To)
}

// XMessageID exposes xMessageID.
var XMessageID = xMessageID
