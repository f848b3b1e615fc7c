package api

import (
	"fmt"
	"regexp"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// StartFailed is StartView.LastErrorCode while the workflow's start keeps
// failing; the relay retries it with backoff.
const StartFailed = "start_failed"

// Effect error codes the API adds to the stored ones.
const (
	// EffectResolvedRetry is the code of an effect an operator resolved
	// with "retry"; the next run acts again.
	EffectResolvedRetry = effects.CodeResolvedRetry
	// EffectUnclassified stands for a stored code outside the shape
	// tenants are shown ([a-z][a-z0-9_]{0,63}), and for a failure without
	// a code.
	EffectUnclassified = "unclassified"
)

// stepFailures are the plain messages of the terminal failures whose
// generic message would not tell a tenant why, by the step's kind and the
// stored code. Anything else gets the generic message.
var stepFailures = map[[2]string]string{
	{refunds.StepReserve, step.CodeInvalidState}: fmt.Sprintf("the refund was refused when its amount was reserved: "+
		"by then it no longer fit in what was left of the charge (another refund had reserved it first), "+
		"the order was no longer paid, or the order already had %d refunds, the most one order may have", refunds.MaxPerOrder),
}

// codeRE is the shape of an error code shown to a tenant.
var codeRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// startView is the tenant's view of an outbox entry: the stored start
// error becomes StartFailed and a plain message.
func startView(e *outbox.Entry) *StartView {
	v := &StartView{State: "queued", Attempts: e.Attempts, RunID: e.RunID, QueuedAt: e.CreatedAt, StartedAt: e.SentAt}
	if e.SentAt != nil {
		v.State = "started"
		return v
	}
	if e.LastError != "" {
		v.LastErrorCode = StartFailed
		v.LastError = "the workflow could not be started yet; keyed retries it automatically"
	}
	return v
}

// effectView is the tenant's view of an effect record: a stable code and a
// plain message instead of the stored failure message.
func effectView(rec *effects.Record) EffectView {
	v := EffectView{Key: rec.Key, Kind: rec.Kind, State: rec.State, Outcome: rec.Result,
		Attempts: rec.Attempts, UpdatedAt: rec.UpdatedAt, FinishedAt: rec.FinishedAt}
	switch rec.State {
	case effects.StateFailedTransient, effects.StateFailedTerminal:
	default:
		return v // succeeded (perhaps resolved by an operator) or claimed: no error to show
	}
	v.ErrorCode = rec.ErrorCode
	if !codeRE.MatchString(v.ErrorCode) {
		v.ErrorCode = EffectUnclassified
	}
	plain, explained := stepFailures[[2]string{rec.Kind, v.ErrorCode}]
	switch {
	case v.ErrorCode == EffectResolvedRetry:
		v.Error = "an operator marked this step to be tried again"
	case rec.State == effects.StateFailedTransient:
		v.Error = "this step failed and will be tried again"
	case explained:
		v.Error = plain
	default:
		v.Error = "this step failed and will not be retried"
	}
	return v
}
