package api

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// The version-1 renderers, pinned: a record stored today must render the
// same bytes in every later release. When one of these fails, the body of
// a response changed: add a renderer of the next outcomeVersion and keep
// this one for the records written before.
func TestOutcomeVersion1RendersThePinnedBodies(t *testing.T) {
	t.Parallel()
	// kept is the outcome a stored record {"status":…,"body":…} keeps.
	kept := func(record string) json.RawMessage {
		var st struct{ Body json.RawMessage }
		require.NoError(t, json.Unmarshal([]byte(record), &st))
		return st.Body
	}
	cases := []struct {
		name, record string
		render       renderer
		want         string
	}{
		{"order",
			`{"body": {"v": 1, "order": {"status": "pending", "created_at": "2026-12-01T21:46:47.214816Z", "updated_at": "2026-12-01T21:46:47.214816+01:00"}}, "status": 201}`,
			orderRenderer("acme", orders.NewOrder{ID: "9f3a", AmountMinor: 1250, Currency: "eur", CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa"}),
			`{"order":{"tenant_id":"acme","id":"9f3a","amount_minor":1250,"currency":"eur","customer_email":"ann@example.com","payment_method":"pm_card_visa",` +
				`"status":"pending","created_at":"2026-12-01T21:46:47.214816Z","updated_at":"2026-12-01T21:46:47.214816+01:00"},"workflow_id":"order:acme:9f3a:fulfil"}` + "\n"},
		{"refund",
			`{"body": {"v": 1, "refund": {"state": "reserved", "start": {"state": "started", "run_id": "run-1", "attempts": 1, "queued_at": "2026-12-01T21:46:47Z", "started_at": "2026-12-01T21:46:48Z"}, ` +
				`"effects": [{"key": "acme:order:9f3a:refund:r1:refund_reserve", "kind": "refund_reserve", "state": "succeeded", "outcome": {"note": "<&>", "amount_minor": 100}, "attempts": 1, "updated_at": "2026-12-01T21:46:49Z", "finished_at": "2026-12-01T21:46:49Z"}], "currency": "eur"}}, "status": 200}`,
			refundRenderer(refunds.NewInput("acme", "9f3a", "r1", 100, "damaged")),
			`{"refund_id":"r1","order_id":"9f3a","amount_minor":100,"currency":"eur","reason":"damaged","state":"reserved","workflow_id":"refund:acme:9f3a:r1",` +
				`"start":{"state":"started","attempts":1,"run_id":"run-1","queued_at":"2026-12-01T21:46:47Z","started_at":"2026-12-01T21:46:48Z"},` +
				`"effects":[{"key":"acme:order:9f3a:refund:r1:refund_reserve","kind":"refund_reserve","state":"succeeded","outcome":{"note":"\u003c\u0026\u003e","amount_minor":100},` +
				`"attempts":1,"updated_at":"2026-12-01T21:46:49Z","finished_at":"2026-12-01T21:46:49Z"}]}` + "\n"},
	}
	for _, c := range cases {
		body, err := replayWith(c.render, kept(c.record))
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, string(body), c.name)
	}

	// A version this binary does not know is refused, not misread.
	for _, rec := range []string{`{"body": {"v": 2, "order": {}}, "status": 201}`, `{"body": null, "status": 201}`} {
		_, err := decodeOutcome(kept(rec))
		require.ErrorContains(t, err, "no outcome of version 1", rec)
	}
	_, err := cases[0].render(&outcome{V: 1, Refund: &refundOutcome{}})
	require.ErrorContains(t, err, "holds no order")
}
