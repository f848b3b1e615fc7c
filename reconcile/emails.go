package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// KindEmailMissingAtProvider: a succeeded receipt or refund email record
// holds a message ID that SendGrid's Email Activity does not show under the
// record's effect key, although its index has had its lag. keyed believes
// the customer was told what they were not.
const KindEmailMissingAtProvider Kind = "email_missing_at_provider"

// emailSteps are the send steps whose records the email pass checks.
var emailSteps = []string{orders.StepReceipt, refunds.StepEmail}

// emailPass checks every succeeded send record of emailSteps created in w
// against SendGrid's Email Activity (notify.Sender.Confirm), adding a
// KindEmailMissingAtProvider finding for each message SendGrid does not
// show, and counting as in flight those it cannot tell yet (the index may
// lag, the look-up failed). It does nothing without a Sender.
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
			if rec.State != effects.StateSucceeded {
				continue
			}
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

// checkEmail asks SendGrid whether rec's message went out under its key.
func (r *Reconciler) checkEmail(ctx context.Context, rec *effects.Record) (*Finding, bool, error) {
	key, err := effects.ParseKey(rec.Key)
	if err != nil {
		return nil, false, fmt.Errorf("parse effect key %q: %w", rec.Key, err)
	}
	var out struct {
		MessageID string `json:"message_id"`
	}
	if err := json.Unmarshal(rec.Result, &out); err != nil || out.MessageID == "" {
		return &Finding{Kind: KindEmailMissingAtProvider, TenantID: key.Tenant(), EffectKey: rec.Key, RecordState: rec.State,
			Detail: "the succeeded send record holds no message ID"}, false, nil
	}
	err = r.sender.Confirm(ctx, key, out.MessageID)
	switch {
	case err == nil:
		return nil, false, nil
	case errors.Is(err, notify.ErrNotSent):
		return &Finding{Kind: KindEmailMissingAtProvider, TenantID: key.Tenant(), EffectKey: rec.Key, RecordState: rec.State,
			Detail: fmt.Sprintf("keyed recorded message %s, and %v", out.MessageID, err)}, false, nil
	}
	return nil, true, nil // Pending index or a failed look-up: the next run checks it.
}
