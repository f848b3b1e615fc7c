// Package stripestep is the Stripe side of keyed steps, for every pipeline
// that calls Stripe: a client that never retries by itself, Stripe's
// errors as step errors, the look-up of what Stripe holds under an effect
// key, and a PaymentIntent as a charge's outcome.
package stripestep

import (
	"context"
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
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// Metadata names keyed sets on every object it creates at Stripe: the
// effect key it was created under, and its tenant.
const (
	MetadataEffectKey = "effect_key"
	MetadataTenantID  = "tenant_id"
)

// defaultTimeout bounds one Stripe request when NewClient gets no HTTP client.
const defaultTimeout = 30 * time.Second

// Provider is the step.Declaration.Provider of every step that calls Stripe.
const Provider = "stripe"

// NewClient returns a Stripe client whose requests go to apiBase (empty
// means stripe.APIURL) through httpClient (nil means one with
// defaultTimeout). It never retries by itself: Temporal retries the step
// with the same idempotency key. It returns an error for an empty key or
// an apiBase that is not an http(s) URL.
func NewClient(secretKey, apiBase string, httpClient *http.Client) (*stripeclient.API, error) {
	if strings.TrimSpace(secretKey) == "" {
		return nil, errors.New("stripestep: NewClient: secret key is empty")
	}
	if apiBase == "" {
		apiBase = stripe.APIURL
	}
	u, err := url.Parse(apiBase)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("stripestep: NewClient: API base %q is not an http(s) URL", apiBase)
	}
	if httpClient == nil {
		httpClient = &http.Client{Timeout: defaultTimeout}
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

// Error classifies err, the error of the Stripe call op (such as "charge
// acme:order:9f3a:charge"), as a step error whose message starts with op,
// never wrapping the *stripe.Error, whose text holds the whole object:
// no answer, 429, 5xx and 409 are Transient (the retry sends the same
// idempotency key); card_error is CardDeclined; idempotency_error is
// KeyReused; anything else is ProviderRejected.
func Error(op string, err error) error {
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

// codeRE finds the "status 400 invalid_request_error/charge_disputed" part
// of an Error's message; its group is Stripe's error code.
var codeRE = regexp.MustCompile(`: status \d{3} [a-z_]+/([a-z_]+)`)

// Code returns Stripe's error code (such as "charge_disputed") from msg,
// the message of an error Error built (as an effect record stores it), or "".
func Code(msg string) string {
	if m := codeRE.FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	return ""
}

// LookupError is the verdict of a failed look-up of what (such as
// "PaymentIntent pi_1"): Stripe's 404 contradicts the outcome; anything
// else leaves it unverifiable.
func LookupError(what string, err error) error {
	var se *stripe.Error
	if errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound {
		return step.Contradicted("Stripe has no %s", what)
	}
	return step.Unverifiable("%v", Error("look up "+what+" at Stripe", err))
}

// keyQuery is the Stripe search query for objects whose metadata effect_key
// is key, with the search syntax's quote and backslash escaped.
func keyQuery(key effects.Key) string {
	return "metadata['" + MetadataEffectKey + "']:'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(key.String()) + "'"
}

// FindCharge returns the first PaymentIntent Stripe's search finds under
// key for which match returns true, or nil. Stripe's index lags creation by
// up to a minute. Errors are Error's.
func FindCharge(ctx context.Context, api *stripeclient.API, key effects.Key, match func(*stripe.PaymentIntent) (bool, error)) (*stripe.PaymentIntent, error) {
	it := api.PaymentIntents.Search(&stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{Query: keyQuery(key), Context: ctx}})
	for it.Next() {
		pi := it.PaymentIntent()
		if pi.Metadata[MetadataEffectKey] != key.String() {
			continue
		}
		ok, err := match(pi)
		if err != nil || ok {
			return pi, err
		}
	}
	if err := it.Err(); err != nil {
		return nil, Error("search charges for "+key.String(), err)
	}
	return nil, nil
}

// ChargeResult is pi as a charge's stored outcome.
func ChargeResult(pi *stripe.PaymentIntent) orders.ChargeResult {
	return orders.ChargeResult{PaymentIntentID: pi.ID, Status: string(pi.Status), AmountMinor: pi.Amount, Currency: string(pi.Currency)}
}

// Mismatch is how a PaymentIntent differs from the charge of an effect key.
type Mismatch int

// The mismatches, checked in this order.
const (
	Matches Mismatch = iota
	OtherKey
	NotSucceeded
	OtherAmount
)

// IntentMismatch says how pi differs from a succeeded charge of amount in
// currency under key, with the reason as text ("" when it matches).
func IntentMismatch(pi *stripe.PaymentIntent, key effects.Key, amount int64, currency string) (Mismatch, string) {
	switch got := pi.Metadata[MetadataEffectKey]; {
	case got != key.String():
		if got == "" {
			return OtherKey, fmt.Sprintf("carries no effect key, not %s", key)
		}
		return OtherKey, fmt.Sprintf("carries the effect key %s, not %s", got, key)
	case pi.Status != stripe.PaymentIntentStatusSucceeded:
		return NotSucceeded, fmt.Sprintf("is %s, not succeeded", pi.Status)
	case pi.Amount != amount || string(pi.Currency) != currency:
		return OtherAmount, fmt.Sprintf("is for %s, the order for %s", orders.FormatAmount(pi.Amount, string(pi.Currency)), orders.FormatAmount(amount, currency))
	}
	return Matches, ""
}
