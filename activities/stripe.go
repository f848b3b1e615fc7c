package activities

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v76"
	stripeclient "github.com/stripe/stripe-go/v76/client"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/step"
)

// DefaultStripeAPIBase is Stripe's API host.
const DefaultStripeAPIBase = "https://api.stripe.com"

// DefaultStripeTimeout bounds one Stripe request when NewStripeClient gets
// no HTTP client.
const DefaultStripeTimeout = 30 * time.Second

// NewStripeClient returns a Stripe client whose API requests go to apiBase
// (empty means DefaultStripeAPIBase) through httpClient (nil means a client
// with DefaultStripeTimeout). The client never retries by itself
// (MaxNetworkRetries 0): Temporal retries the activity, with the same
// idempotency key, and the effect claim decides what a retry does. The
// library's own logging is off; the activities log with the effect key. It
// returns an error for an empty key or an apiBase that is not an http(s)
// URL.
func NewStripeClient(secretKey, apiBase string, httpClient *http.Client) (*stripeclient.API, error) {
	if strings.TrimSpace(secretKey) == "" {
		return nil, errors.New("activities: NewStripeClient: secret key is empty")
	}
	if apiBase == "" {
		apiBase = DefaultStripeAPIBase
	}
	u, err := url.Parse(apiBase)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("activities: NewStripeClient: API base %q is not an http(s) URL", apiBase)
	}
	if httpClient == nil {
		httpClient = &http.Client{Timeout: DefaultStripeTimeout}
	}
	backend := func(t stripe.SupportedBackend, base *string) stripe.Backend {
		return stripe.GetBackendWithConfig(t, &stripe.BackendConfig{
			URL:               base,
			HTTPClient:        httpClient,
			MaxNetworkRetries: stripe.Int64(0),
			LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		})
	}
	return stripeclient.New(secretKey, &stripe.Backends{
		API:     backend(stripe.APIBackend, stripe.String(strings.TrimRight(apiBase, "/"))),
		Connect: backend(stripe.ConnectBackend, nil),
		Uploads: backend(stripe.UploadsBackend, nil),
	}), nil
}

// StripeError classifies err, the error of the Stripe call op (such as
// "charge acme:order:9f3a:charge"), as a keyed activity returns it: an
// *Error whose message starts with op. It never wraps the *stripe.Error
// itself, whose text includes the whole payment intent.
//
//   - No answer (timeout, reset, EOF), 429, 5xx, and 409 (idempotency key in
//     use, lock timeout): ErrTypeTransient, marked effects.Transient. The
//     call may or may not have acted; the retry sends the same idempotency
//     key, so Stripe answers with the first outcome instead of acting again.
//   - card_error: ErrTypeCardDeclined.
//   - idempotency_error: ErrTypeKeyReused (the key came back with other
//     parameters).
//   - Anything else (invalid_request_error such as charge_already_refunded,
//     authentication): terminal ErrTypeProviderRejected.
func StripeError(op string, err error) error {
	var se *stripe.Error
	if !errors.As(err, &se) {
		reason := err.Error()
		var uerr *url.Error
		if errors.As(err, &uerr) {
			reason = uerr.Err.Error()
		}
		return effects.Transient(&step.Error{Type: step.ErrTypeTransient,
			Message: fmt.Sprintf("%s: %s: no answer from Stripe: %s", op, step.ErrProviderUnavailable, reason)})
	}
	detail := string(se.Type)
	if se.Code != "" {
		detail += "/" + string(se.Code)
	}
	if se.DeclineCode != "" {
		detail += "/" + string(se.DeclineCode)
	}
	detail = fmt.Sprintf("%s: status %d %s: %s", op, se.HTTPStatusCode, detail, se.Msg)
	if se.RequestID != "" {
		detail += " (request " + se.RequestID + ")"
	}
	switch {
	case se.HTTPStatusCode == http.StatusTooManyRequests, se.Code == stripe.ErrorCodeRateLimit,
		se.HTTPStatusCode >= 500, se.Type == stripe.ErrorTypeAPI,
		se.HTTPStatusCode == http.StatusConflict, se.Code == stripe.ErrorCodeIdempotencyKeyInUse, se.Code == stripe.ErrorCodeLockTimeout:
		return effects.Transient(&step.Error{Type: step.ErrTypeTransient, Message: detail})
	case se.Type == stripe.ErrorTypeCard:
		return &step.Error{Type: step.ErrTypeCardDeclined, Message: detail}
	case se.Type == stripe.ErrorTypeIdempotency:
		return &step.Error{Type: step.ErrTypeKeyReused, Message: detail}
	}
	return &step.Error{Type: step.ErrTypeProviderRejected, Message: detail}
}

// stripeCodeRE finds the "status 400 invalid_request_error/charge_disputed"
// part of a StripeError message; its group is Stripe's error code.
var stripeCodeRE = regexp.MustCompile(`: status \d{3} [a-z_]+/([a-z_]+)`)

// StripeCode returns Stripe's error code (such as "charge_disputed") from
// msg, the message of an error StripeError built (and that an effect
// record stores as its error message), or "" when msg carries none. It
// reads StripeError's own format, so the two change together
// (TestStripeCodeReadsStripeErrorsMessage).
func StripeCode(msg string) string {
	if m := stripeCodeRE.FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	return ""
}

// searchQuery is the Stripe search query for payment intents whose
// metadata effect_key is key.
func searchQuery(key string) string {
	return "metadata['effect_key']:'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(key) + "'"
}
