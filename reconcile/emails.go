package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// The kinds of email finding.
const (
	// KindDuplicateEmails: SendGrid's Email Activity shows more than one
	// message under one send's effect key. The customer got it twice.
	KindDuplicateEmails Kind = "duplicate_emails"
	// KindUnrecordedEmail: SendGrid shows a message under the effect key of
	// a send whose record did not succeed (failed, or still waiting for a
	// decision, which the settler settles). The customer got an email keyed
	// does not show as sent.
	KindUnrecordedEmail Kind = "unrecorded_email"
	// KindEmailMissingAtProvider: a succeeded receipt or refund email
	// record holds a message ID SendGrid does not show under the record's
	// effect key, although its index has had its lag. keyed believes the
	// customer was told what they were not.
	KindEmailMissingAtProvider Kind = "email_missing_at_provider"
)

// emailSteps are the send steps whose records the email pass checks.
var emailSteps = []string{orders.StepReceipt, refunds.StepEmail}

// emailPass looks up at SendGrid's Email Activity the effect key of every
// send record of emailSteps created in w, whatever its state, and adds a
// finding for a key with more than one message, a message under a send
// that did not succeed, and a succeeded send whose message SendGrid does
// not show. A key whose look-up fails, or whose index may still lag,
// counts as in flight. It does nothing without a Sender.
func (r *Reconciler) emailPass(ctx context.Context, w Window, rep *Report) error {
	if r.sender == nil {
		return nil
	}
	for _, step := range emailSteps {
		recs, err := r.claims.ListKind(ctx, step, w.From, w.To)
		if err != nil {
			return err
		}
		for _, rec := range recs {
			rep.Emails++
			f, inFlight, err := r.checkEmail(ctx, rec)
			switch {
			case err != nil:
				return err
			case inFlight:
				rep.InFlight++
			case f != nil:
				rep.Findings = append(rep.Findings, *f)
			}
		}
	}
	return nil
}

// checkEmail compares what SendGrid shows under rec's key with rec.
func (r *Reconciler) checkEmail(ctx context.Context, rec *effects.Record) (*Finding, bool, error) {
	key, err := effects.ParseKey(rec.Key)
	if err != nil {
		return nil, false, fmt.Errorf("parse effect key %q: %w", rec.Key, err)
	}
	ids, settled, err := r.sender.Lookup(ctx, key)
	if err != nil {
		return nil, true, nil // The next run asks again.
	}
	finding := func(kind Kind, format string, args ...any) *Finding {
		return &Finding{Kind: kind, TenantID: key.Tenant(), EffectKey: rec.Key, RecordState: rec.State, Detail: fmt.Sprintf(format, args...)}
	}
	recorded := recordedMessage(rec)
	switch {
	case len(ids) > 1:
		return finding(KindDuplicateEmails, "SendGrid shows %d messages under the key: %s", len(ids), strings.Join(ids, ", ")), false, nil
	case rec.State != effects.StateSucceeded && len(ids) == 1:
		return finding(KindUnrecordedEmail, "SendGrid shows message %s under the key, and the send's record is %s", ids[0], rec.State), false, nil
	case rec.State != effects.StateSucceeded:
		return nil, false, nil
	case recorded == "":
		return finding(KindEmailMissingAtProvider, "the succeeded send record holds no message ID"), false, nil
	case slices.Contains(ids, recorded):
		return nil, false, nil
	case !settled:
		return nil, true, nil
	}
	return finding(KindEmailMissingAtProvider, "keyed recorded message %s, and SendGrid shows %s under the key after its index lag",
		recorded, noMessageOr(ids)), false, nil
}

// recordedMessage returns the message ID a succeeded send record holds, or "".
func recordedMessage(rec *effects.Record) string {
	var out struct {
		MessageID string `json:"message_id"`
	}
	if err := json.Unmarshal(rec.Result, &out); err != nil {
		return "" // Not a send's outcome: reported as holding none.
	}
	return out.MessageID
}

// noMessageOr renders ids, or "no message".
func noMessageOr(ids []string) string {
	if len(ids) == 0 {
		return "no message"
	}
	return strings.Join(ids, ", ")
}
