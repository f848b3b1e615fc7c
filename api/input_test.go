package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
)

// Every bad-input case gets its status and a JSON error naming the field,
// and writes nothing: no order, no outbox row, no idempotency record.
func TestBadInputGetsItsStatusAndWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	valid := orderBody("ord_1", 1999)
	replace := func(old, new string) string { return strings.Replace(valid, old, new, 1) }
	without := func(member string) string {
		for _, m := range strings.Split(strings.Trim(valid, "{}"), ",") {
			if strings.HasPrefix(m, `"`+member+`"`) {
				out := strings.Replace(valid, m+",", "", 1)
				return strings.Replace(out, ","+m, "", 1)
			}
		}
		panic(member)
	}
	cases := []struct {
		name        string
		method      string
		path        string
		idemKey     []string // nil: a fresh valid key
		contentType string
		body        string
		status      int
		code        string
		field       string
	}{
		{name: "missing Idempotency-Key", idemKey: []string{}, body: valid, status: 400, code: api.CodeMissingIdempotencyKey, field: "Idempotency-Key"},
		{name: "empty Idempotency-Key", idemKey: []string{""}, body: valid, status: 400, code: api.CodeInvalidIdempotencyKey, field: "Idempotency-Key"},
		{name: "Idempotency-Key over 255 bytes", idemKey: []string{strings.Repeat("k", 256)}, body: valid, status: 400, code: api.CodeInvalidIdempotencyKey, field: "Idempotency-Key"},
		{name: "Idempotency-Key with a space", idemKey: []string{"two words"}, body: valid, status: 400, code: api.CodeInvalidIdempotencyKey, field: "Idempotency-Key"},
		{name: "Idempotency-Key with a control byte", idemKey: []string{"k\x01"}, body: valid, status: 400, code: api.CodeInvalidIdempotencyKey, field: "Idempotency-Key"},
		{name: "Idempotency-Key non-ASCII", idemKey: []string{"clé"}, body: valid, status: 400, code: api.CodeInvalidIdempotencyKey, field: "Idempotency-Key"},
		{name: "two Idempotency-Keys", idemKey: []string{"a", "b"}, body: valid, status: 400, code: api.CodeInvalidIdempotencyKey, field: "Idempotency-Key"},
		{name: "form-encoded body", contentType: "application/x-www-form-urlencoded", body: "order_id=ord_1&amount_minor=1999", status: 400, code: api.CodeInvalidJSON},
		{name: "body over 64 KiB", body: `{"order_id":"` + strings.Repeat("x", 64<<10) + `"}`, status: 413, code: api.CodeBodyTooLarge},
		{name: "empty body", body: "", status: 400, code: api.CodeInvalidJSON},
		{name: "invalid JSON", body: `{"order_id":"ord_1",`, status: 400, code: api.CodeInvalidJSON},
		{name: "not JSON", body: `order_id=ord_1`, status: 400, code: api.CodeInvalidJSON},
		{name: "JSON array", body: `[` + valid + `]`, status: 400, code: api.CodeInvalidJSON},
		{name: "two objects", body: valid + valid, status: 400, code: api.CodeInvalidJSON},
		{name: "unknown field", body: replace(`"currency"`, `"coupon":"FREE","currency"`), status: 400, code: api.CodeUnknownField, field: "coupon"},
		{name: "tenant in body", body: replace(`"currency"`, `"tenant_id":"other","currency"`), status: 400, code: api.CodeUnknownField, field: "tenant_id"},
		{name: "missing order_id", body: without("order_id"), status: 400, code: api.CodeMissingField, field: "order_id"},
		{name: "missing amount_minor", body: without("amount_minor"), status: 400, code: api.CodeMissingField, field: "amount_minor"},
		{name: "missing currency", body: without("currency"), status: 400, code: api.CodeMissingField, field: "currency"},
		{name: "missing customer_email", body: without("customer_email"), status: 400, code: api.CodeMissingField, field: "customer_email"},
		{name: "missing payment_method", body: without("payment_method"), status: 400, code: api.CodeMissingField, field: "payment_method"},
		{name: "null member", body: replace(`"currency":"usd"`, `"currency":null`), status: 400, code: api.CodeMissingField, field: "currency"},
		{name: "zero amount", body: replace(`1999`, `0`), status: 400, code: api.CodeInvalidField, field: "amount_minor"},
		{name: "negative amount", body: replace(`1999`, `-5`), status: 400, code: api.CodeInvalidField, field: "amount_minor"},
		{name: "fractional amount", body: replace(`1999`, `19.99`), status: 400, code: api.CodeInvalidField, field: "amount_minor"},
		{name: "amount as string", body: replace(`1999`, `"1999"`), status: 400, code: api.CodeInvalidField, field: "amount_minor"},
		{name: "huge amount", body: replace(`1999`, `100000000000`), status: 400, code: api.CodeInvalidField, field: "amount_minor"},
		{name: "unknown currency", body: replace(`"usd"`, `"xyz"`), status: 400, code: api.CodeInvalidField, field: "currency"},
		{name: "bad email", body: replace(`ada@example.com`, `not-an-email`), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email with U+202E", body: replace(`ada@example.com`, `ada\u202e@example.com`), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email with zero-width space", body: replace(`ada@example.com`, "ada\u200b@example.com"), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email with BOM", body: replace(`ada@example.com`, "\ufeffada@example.com"), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email with U+FE0F", body: replace(`ada@example.com`, "ada\ufe0f@example.com"), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email with U+034F", body: replace(`ada@example.com`, "ada\u034f@example.com"), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email with U+180B", body: replace(`ada@example.com`, "ada\u180b@example.com"), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email with U+3164", body: replace(`ada@example.com`, "ada\u3164@example.com"), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email with U+FFA0", body: replace(`ada@example.com`, "ada\uffa0@example.com"), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email with U+2800", body: replace(`ada@example.com`, "ada\u2800@example.com"), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email with a lone U+0301 local part", body: replace(`ada@example.com`, "\u0301@example.com"), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email with C1 control", body: replace(`ada@example.com`, `ada\u0085@example.com`), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email without a dot", body: replace(`ada@example.com`, `a@b`), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email to an IP literal", body: replace(`ada@example.com`, `a@[127.0.0.1]`), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email domain with leading hyphen", body: replace(`ada@example.com`, `a@-b.com`), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "email of 60 KB", body: replace(`ada@example.com`, strings.Repeat("a", 60<<10)+`@example.com`), status: 400, code: api.CodeInvalidField, field: "customer_email"},
		{name: "duplicate member", body: replace(`"currency":"usd"`, `"currency":"usd","currency":"eur"`), status: 400, code: api.CodeDuplicateField, field: "currency"},
		{name: "duplicate amount", body: replace(`"amount_minor":1999`, `"amount_minor":1999,"amount_minor":1`), status: 400, code: api.CodeDuplicateField, field: "amount_minor"},
		{name: "case-variant member", body: replace(`"currency"`, `"Currency"`), status: 400, code: api.CodeUnknownField, field: "Currency"},
		{name: "case-variant duplicate", body: replace(`"currency":"usd"`, `"currency":"usd","CURRENCY":"eur"`), status: 400, code: api.CodeUnknownField, field: "CURRENCY"},
		{name: "Kelvin sign in currency", body: replace(`"usd"`, `"dk\u212a"`), status: 400, code: api.CodeInvalidField, field: "currency"},
		{name: "long s in a member name", body: replace(`"customer_email"`, "\"cu\u017ftomer_email\""), status: 400, code: api.CodeUnknownField, field: "cu\u017ftomer_email"},
		{name: "bad payment method", body: replace(`pm_card_visa`, `4242424242424242`), status: 400, code: api.CodeInvalidField, field: "payment_method"},
		{name: "order_id with separator", body: replace(`ord_1`, `ord:1`), status: 400, code: api.CodeInvalidField, field: "order_id"},
		{name: "order_id too long", body: replace(`ord_1`, strings.Repeat("o", 65)), status: 400, code: api.CodeInvalidField, field: "order_id"},
		{name: "empty order_id", body: replace(`ord_1`, ``), status: 400, code: api.CodeInvalidField, field: "order_id"},
		{name: "order_id with a slash", body: replace(`ord_1`, `a/b`), status: 400, code: api.CodeInvalidField, field: "order_id"},
		{name: "order_id of dots", body: replace(`ord_1`, `..`), status: 400, code: api.CodeInvalidField, field: "order_id"},
		{name: "email with a byte that is not UTF-8", body: replace(`ada@example.com`, "a\xc3@example.com"), status: 400, code: api.CodeInvalidJSON},
		{name: "email with half a surrogate pair", body: replace(`ada@example.com`, `a\ud800@example.com`), status: 400, code: api.CodeInvalidJSON},
		{name: "order_id with a low surrogate alone", body: replace(`ord_1`, `\udc00x`), status: 400, code: api.CodeInvalidJSON},
		{name: "high surrogate before a letter", body: replace(`ada@example.com`, `a\ud83d\u0041@example.com`), status: 400, code: api.CodeInvalidJSON},
		{name: "bad order ID on GET", method: "GET", path: "/v1/orders/a%3Ab", status: 400, code: api.CodeInvalidField, field: "id"},
		{name: "null body", body: `null`, status: 400, code: api.CodeInvalidJSON},
		{name: "non-ASCII order_id", body: replace(`ord_1`, `ünï`), status: 400, code: api.CodeInvalidField, field: "order_id"},
		{name: "order_id of 240 bytes", body: replace(`ord_1`, strings.Repeat("o", 240)), status: 400, code: api.CodeInvalidField, field: "order_id"},
		{name: "amount of 60 000 digits", body: replace(`1999`, strings.Repeat("9", 60_000)), status: 400, code: api.CodeInvalidField, field: "amount_minor"},
		{name: "unknown member of 3000 bytes", body: replace(`"currency"`, `"`+strings.Repeat("m", 3000)+`":1,"currency"`), status: 400, code: api.CodeUnknownField, field: strings.Repeat("m", 64)},
		{name: "currency of 3000 bytes", body: replace(`"usd"`, `"`+strings.Repeat("c", 3000)+`"`), status: 400, code: api.CodeInvalidField, field: "currency"},
		{name: "path with an empty segment", method: "GET", path: "/v1//orders/ord_1", status: 404, code: api.CodeNotFound},
		{name: "path with a dot-dot segment", method: "POST", path: "/v1/orders/x/refunds/..", status: 404, code: api.CodeNotFound},
		{name: "path of 20 KB", method: "GET", path: "/" + strings.Repeat("p", 20<<10), status: 404, code: api.CodeNotFound},
		{name: "method of 5 KB", method: strings.Repeat("M", 5<<10), path: "/v1/orders", status: 405, code: api.CodeMethodNotAllowed},
	}
	for i, tc := range cases {
		method, path := tc.method, tc.path
		if method == "" {
			method, path = "POST", "/v1/orders"
		}
		req := httptest.NewRequest(method, path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+b.keyA)
		if method == "POST" {
			keys := tc.idemKey
			if keys == nil {
				keys = []string{"bad-input-" + strings.Repeat("x", i)}
			}
			for _, k := range keys {
				req.Header.Add(api.HeaderIdempotencyKey, k)
			}
			ct := tc.contentType
			if ct == "" {
				ct = "application/json; charset=utf-8"
			}
			req.Header.Set("Content-Type", ct)
		}
		rec := httptest.NewRecorder()
		b.handler.ServeHTTP(rec, req)
		r := response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
		require.Equal(t, tc.status, r.status, "%s: %s", tc.name, r.body)
		require.Equal(t, "application/json", r.header.Get("Content-Type"), tc.name)
		e := decodeError(t, r)
		require.Equal(t, tc.code, e.Code, "%s: %s", tc.name, r.body)
		require.Equal(t, tc.field, e.Field, "%s: %s", tc.name, r.body)
		require.Less(t, len(e.Message), 300, "%s: a refused value is quoted cut short: %s", tc.name, r.body)
		require.NotRegexp(t, `part \d`, e.Message, "%s: effect-key internals: %s", tc.name, r.body)
		require.Equal(t, map[string]int{"orders": 0, "keyed_outbox": 0, "api_requests": 0, "effects": 0}, b.rows(t),
			"%s wrote something", tc.name)
	}

	// A rejected request leaves its key unused: fixing the body and sending
	// the same key creates the order.
	req := httptest.NewRequest("POST", "/v1/orders", strings.NewReader(replace(`1999`, `0`)))
	req.Header.Set("Authorization", "Bearer "+b.keyA)
	req.Header.Set(api.HeaderIdempotencyKey, "fix-me")
	rec := httptest.NewRecorder()
	b.handler.ServeHTTP(rec, req)
	require.Equal(t, http.StatusBadRequest, rec.Code)
	r := b.do(t, "POST", "/v1/orders", b.keyA, "fix-me", valid)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)

	// curl -d's default Content-Type does not matter; the body is JSON.
	req = httptest.NewRequest("POST", "/v1/orders", strings.NewReader(orderBody("ord_curl", 5)))
	req.Header.Set("Authorization", "Bearer "+b.keyA)
	req.Header.Set(api.HeaderIdempotencyKey, "curl")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec = httptest.NewRecorder()
	b.handler.ServeHTTP(rec, req)
	require.Equal(t, http.StatusCreated, rec.Code, "%s", rec.Body)

	// Upper-case currency is accepted and stored as Stripe writes it.
	r = b.do(t, "POST", "/v1/orders", b.keyA, "upper", strings.Replace(orderBody("ord_2", 5), `"usd"`, `"EUR"`, 1))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Contains(t, string(r.body), `"currency":"eur"`)
}
