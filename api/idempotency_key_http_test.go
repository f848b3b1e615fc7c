package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
)

// A key sent bare (as Stripe sends it) and as an RFC 8941 string (as the
// IETF draft sends it) is one key, whichever form comes first: the other
// form with the same body replays the first response, with another body
// it is 422. The same holds for a refund.
func TestBareAndQuotedIdempotencyKeyAreOneKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i, forms := range [][2]string{
		{`k-forms-1`, `"k-forms-1"`},
		{`"k-forms-2"`, `k-forms-2`},
		{`k"q\z`, `"k\"q\\z"`}, // a bare key may hold " and \; quoted, they are escaped
	} {
		id := "ord_forms_" + string(rune('a'+i))
		first := b.do(t, "POST", "/v1/orders", b.keyA, forms[0], orderBody(id, 1000))
		require.Equal(t, http.StatusCreated, first.status, "%s: %s", forms[0], first.body)
		require.Empty(t, first.header.Get(api.HeaderReplayed))

		again := b.do(t, "POST", "/v1/orders", b.keyA, forms[1], orderBody(id, 1000))
		require.Equal(t, http.StatusCreated, again.status, "%s after %s: %s", forms[1], forms[0], again.body)
		require.Equal(t, "true", again.header.Get(api.HeaderReplayed), "%s replays %s", forms[1], forms[0])
		require.Equal(t, string(first.body), string(again.body))

		other := b.do(t, "POST", "/v1/orders", b.keyA, forms[1], orderBody(id+"_other", 1000))
		require.Equal(t, http.StatusUnprocessableEntity, other.status, "%s with another body: %s", forms[1], other.body)
		require.Equal(t, api.CodeIdempotencyKeyReused, decodeError(t, other).Code)
	}
	require.Equal(t, map[string]int{"orders": 3, "keyed_outbox": 3, "api_requests": 3, "effects": 0}, b.rows(t))

	b.paidOrder(t, "ord_forms_refund", 1000)
	refund := `{"refund_id":"r1","amount_minor":100}`
	first := b.do(t, "POST", "/v1/orders/ord_forms_refund/refunds", b.keyA, "k-forms-refund", refund)
	require.Equal(t, http.StatusAccepted, first.status, "%s", first.body)
	again := b.do(t, "POST", "/v1/orders/ord_forms_refund/refunds", b.keyA, `"k-forms-refund"`, refund)
	require.Equal(t, http.StatusAccepted, again.status, "%s", again.body)
	require.Equal(t, "true", again.header.Get(api.HeaderReplayed))
	other := b.do(t, "POST", "/v1/orders/ord_forms_refund/refunds", b.keyA, `"k-forms-refund"`, `{"refund_id":"r2","amount_minor":100}`)
	require.Equal(t, http.StatusUnprocessableEntity, other.status, "%s", other.body)
}

// Malformed quoting is a 400 invalid_idempotency_key with the API's error
// body, saying what is wrong without quoting the value, and writes nothing.
func TestMalformedQuotedIdempotencyKeyIs400(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for value, says := range map[string]string{
		`"abc`:                               "does not close",
		`"abc\"`:                             "does not close",
		`"ab\c"`:                             "may only escape",
		`"abc\`:                              "ends in a backslash",
		`"abc";v=1`:                          "parameters",
		`"abc" "def"`:                        "after its closing quote",
		`"abc",def`:                          "after its closing quote",
		`""`:                                 "empty",
		"\"ab\x01c\"":                        "printable ASCII",
		"\"cl\u00e9\"":                       "printable ASCII",
		`"` + strings.Repeat("k", 256) + `"`: "limit is 255",
	} {
		req := httptest.NewRequest("POST", "/v1/orders", strings.NewReader(orderBody("ord_bad_key", 1000)))
		req.Header.Set("Authorization", "Bearer "+b.keyA)
		req.Header.Set(api.HeaderIdempotencyKey, value)
		rec := httptest.NewRecorder()
		b.handler.ServeHTTP(rec, req)
		r := response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
		require.Equal(t, http.StatusBadRequest, r.status, "%q: %s", value, r.body)
		require.Equal(t, "application/json", r.header.Get("Content-Type"))
		e := decodeError(t, r)
		require.Equal(t, api.CodeInvalidIdempotencyKey, e.Code, "%q", value)
		require.Equal(t, api.HeaderIdempotencyKey, e.Field)
		require.Contains(t, e.Message, says, "%q", value)
		if len(value) > 8 {
			require.NotContains(t, e.Message, value[1:len(value)-1], "the message does not echo the value")
		}
	}
	require.Equal(t, map[string]int{"orders": 0, "keyed_outbox": 0, "api_requests": 0, "effects": 0}, b.rows(t))

	// A quoted key may hold spaces, as RFC 8941 strings may.
	r := b.do(t, "POST", "/v1/orders", b.keyA, `"two words"`, orderBody("ord_spaced_key", 1000))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
}
