package tests

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
)

// An at-most-once receipt whose response is lost, while SendGrid's Email
// Activity API cannot be asked for longer than keyed waits, is ambiguous:
// keyed does not send again and fails the run, naming the key. The operator finds the
// message at the provider, resolves the effect as done, and re-runs the
// checkout: the re-run replays every step and sends nothing.
func TestAmbiguousReceiptResolvedByOperator(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// SendGrid accepts the receipt, the answer is lost, and its Email
	// Activity API is down for longer than keyed waits: nobody can know.
	b.acts = b.newActivities(t, func(o *notify.SenderOpts) {
		o.HTTPClient = &http.Client{Timeout: 2 * time.Second}
		o.LookupLag, o.LookupGiveUp, o.CollapseWindow = time.Second, time.Second, time.Minute
	})
	b.startWorker(t)
	b.order(t, "amb1", 1500, "pm_card_visa")
	in := orders.NewCheckoutInput(b.tenant, "amb1")
	receiptKey, err := in.EffectKey(orders.StepReceipt)
	require.NoError(t, err)
	b.mail.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
	b.mail.SetLookupOutage(true)

	first := b.start(t, in)
	_, err = b.wait(t, first)
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "want an application error, got %v", err)
	require.Equal(t, "Ambiguous", appErr.Type())
	require.Contains(t, err.Error(), receiptKey.String())
	require.Equal(t, 1, b.mail.Count(), "the provider did get the message")

	// The operator looks the key up at the provider and settles it.
	b.mail.SetLookupOutage(false)
	msgs := b.mail.MessagesFor("effect_key", receiptKey.String())
	require.Len(t, msgs, 1)
	_, err = b.effects.Resolve(b.ctx, receiptKey, effects.ResolveParams{Resolution: effects.ResolveDone,
		Result: orders.ReceiptResult{MessageID: msgs[0].MessageID}, Reason: "found in SendGrid by custom_args"})
	require.NoError(t, err)

	again := b.start(t, in)
	require.True(t, again.Created, "a failed order may run again")
	res, err := b.wait(t, again)
	require.NoError(t, err)
	require.Equal(t, msgs[0].MessageID, res.Receipt.MessageID)
	require.Equal(t, 1, b.stripe.Charges())
	require.Equal(t, 1, b.mail.Count(), "no second email")
}
