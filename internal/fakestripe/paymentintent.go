package fakestripe

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/keyedhq/keyed/internal/fakefault"
)

// paymentIntent is the JSON shape of a Stripe PaymentIntent. It is never
// mutated once stored, so it can be marshalled without holding the lock.
type paymentIntent struct {
	ID                        string            `json:"id"`
	Object                    string            `json:"object"`
	Amount                    int64             `json:"amount"`
	AmountCapturable          int64             `json:"amount_capturable"`
	AmountReceived            int64             `json:"amount_received"`
	CaptureMethod             string            `json:"capture_method"`
	ClientSecret              string            `json:"client_secret"`
	ConfirmationMethod        string            `json:"confirmation_method"`
	Created                   int64             `json:"created"`
	Currency                  string            `json:"currency"`
	Customer                  *string           `json:"customer"`
	Description               *string           `json:"description"`
	LastPaymentError          *apiError         `json:"last_payment_error"`
	LatestCharge              *string           `json:"latest_charge"`
	Livemode                  bool              `json:"livemode"`
	Metadata                  map[string]string `json:"metadata"`
	PaymentMethod             *string           `json:"payment_method"`
	PaymentMethodTypes        []string          `json:"payment_method_types"`
	ReceiptEmail              *string           `json:"receipt_email"`
	StatementDescriptor       *string           `json:"statement_descriptor"`
	StatementDescriptorSuffix *string           `json:"statement_descriptor_suffix"`
	Status                    string            `json:"status"`
	TransferGroup             *string           `json:"transfer_group"`

	charged bool
	at      time.Time
}

// decline is the outcome of one of Stripe's declining test payment methods.
type decline struct{ code, declineCode, message string }

var declines = map[string]decline{
	"pm_card_chargeDeclined":                  {"card_declined", "generic_decline", "Your card was declined."},
	"pm_card_insufficientFunds":               {"card_declined", "insufficient_funds", "Your card has insufficient funds."},
	"pm_card_chargeDeclinedInsufficientFunds": {"card_declined", "insufficient_funds", "Your card has insufficient funds."},
	"pm_card_chargeDeclinedLostCard":          {"card_declined", "lost_card", "Your card was declined."},
	"pm_card_chargeDeclinedStolenCard":        {"card_declined", "stolen_card", "Your card was declined."},
	"pm_card_chargeDeclinedFraudulent":        {"card_declined", "fraudulent", "Your card was declined."},
	"pm_card_chargeDeclinedExpiredCard":       {"expired_card", "expired_card", "Your card has expired."},
	"pm_card_chargeDeclinedIncorrectCvc":      {"incorrect_cvc", "incorrect_cvc", "Your card's security code is incorrect."},
	"pm_card_chargeDeclinedProcessingError":   {"processing_error", "processing_error", "An error occurred while processing your card. Try again in a little bit."},
}

// knownParams are the top-level PaymentIntent create parameters; Stripe
// rejects any other.
var knownParams = map[string]bool{}

func init() {
	for _, p := range strings.Fields(`amount application_fee_amount automatic_payment_methods capture_method
		confirm confirmation_method confirmation_token currency customer description error_on_requires_action
		expand mandate mandate_data metadata off_session on_behalf_of payment_method payment_method_configuration
		payment_method_data payment_method_options payment_method_types radar_options receipt_email return_url
		setup_future_usage shipping statement_descriptor statement_descriptor_suffix transfer_data transfer_group
		use_stripe_sdk`) {
		knownParams[p] = true
	}
}

// idemScope identifies an idempotency key; keys are scoped per API key.
type idemScope struct{ apiKey, key string }

// idemEntry is a stored (or in-flight, while !done) idempotent request.
type idemEntry struct {
	fingerprint string
	done        bool
	status      int
	body        []byte
	requestID   string
	created     time.Time
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, apiKey string) {
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, &apiError{Type: "invalid_request_error", Message: "Invalid request body: " + err.Error()})
		return
	}
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if len(key) > 255 {
		writeError(w, http.StatusBadRequest, &apiError{Type: "invalid_request_error",
			Message: "Idempotency-Key must be at most 255 characters long."})
		return
	}
	fault, _ := s.faults.Take(key)
	switch fault.Kind {
	case FaultServerError:
		time.Sleep(fault.Delay)
		writeError(w, http.StatusInternalServerError, &apiError{Type: "api_error",
			Message: "An unknown error occurred. Please try again later."})
		return
	case FaultRateLimit:
		time.Sleep(fault.Delay)
		writeError(w, http.StatusTooManyRequests, &apiError{Type: "invalid_request_error", Code: "rate_limit",
			Message: "Request rate limit exceeded. You can learn more about rate limits here https://stripe.com/docs/rate-limits."})
		return
	}
	if key != "" {
		w.Header().Set("Idempotency-Key", key)
	}
	scope := idemScope{apiKey, key}
	entry, replay, errStatus, apiErr := s.beginIdempotent(scope, r.Method+" "+r.URL.Path+"?"+r.PostForm.Encode())
	if apiErr != nil {
		writeError(w, errStatus, apiErr)
		return
	}
	if fault.Kind != FaultHoldResponse {
		time.Sleep(fault.Delay)
	}

	var status int
	var body []byte
	if replay {
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Original-Request", entry.requestID)
		status, body = entry.status, entry.body
	} else {
		var pi *paymentIntent
		pi, status, apiErr = s.execute(r.PostForm, key)
		if body = errorBody(apiErr); apiErr == nil {
			body = mustJSON(pi)
		}
		// Like Stripe, store results only once execution began: declines
		// are stored, validation errors are not (and 5xx never are).
		s.finishIdempotent(scope, entry, status, body, w.Header().Get("Request-Id"), pi != nil)
	}
	if fault.Kind == FaultHoldResponse {
		// The charge has happened; the caller just does not hear about it
		// yet. A test can kill the caller in this window.
		time.Sleep(fault.Delay)
	}
	if fault.Kind == FaultDropResponse {
		fakefault.DropConnection(w)
		return
	}
	writeRaw(w, status, body)
}

// beginIdempotent looks up scope. It returns the stored entry to replay, or an
// error to answer with, or marks a new entry in flight and returns it. Without
// a key it returns a nil entry.
func (s *Server) beginIdempotent(scope idemScope, fingerprint string) (e *idemEntry, replay bool, status int, apiErr *apiError) {
	if scope.key == "" {
		return nil, false, 0, nil
	}
	now := s.opts.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.idem[scope]; e != nil && now.Sub(e.created) < s.opts.IdempotencyTTL {
		switch {
		case e.fingerprint != fingerprint:
			return nil, false, http.StatusBadRequest, &apiError{Type: "idempotency_error", Message: fmt.Sprintf(
				"Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '%s' if you meant to execute a different request.", scope.key)}
		case !e.done:
			return nil, false, http.StatusConflict, &apiError{Type: "invalid_request_error", Code: "idempotency_key_in_use", Message: fmt.Sprintf(
				"There is currently another in-progress request using this Stripe-Idempotency-Key (that probably means you submitted twice, and the other request is still going through): %s. Please try again later.", scope.key)}
		}
		return e, true, 0, nil
	}
	e = &idemEntry{fingerprint: fingerprint, created: now}
	s.idem[scope] = e
	return e, false, 0, nil
}

// finishIdempotent stores the result in e, or forgets e if !store.
func (s *Server) finishIdempotent(scope idemScope, e *idemEntry, status int, body []byte, requestID string, store bool) {
	if e == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.idem[scope] != e { // Reset while in flight.
		return
	}
	if !store {
		delete(s.idem, scope)
		return
	}
	e.done, e.status, e.body, e.requestID = true, status, body, requestID
}

// execute validates params and creates a payment intent, charging it when
// confirmed. It returns the intent, or an error with a nil intent when
// nothing was created; a decline returns both.
func (s *Server) execute(p url.Values, idemKey string) (*paymentIntent, int, *apiError) {
	invalid := func(param, code, msg string) (*paymentIntent, int, *apiError) {
		return nil, http.StatusBadRequest, &apiError{Type: "invalid_request_error", Param: param, Code: code, Message: msg}
	}
	meta := map[string]string{}
	for k := range p {
		name, _, _ := strings.Cut(k, "[")
		if !knownParams[name] {
			return invalid(k, "parameter_unknown", "Received unknown parameter: "+k)
		}
		if mk, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(mk, "]") {
			mk = strings.TrimSuffix(mk, "]")
			switch v := p.Get(k); {
			case len(mk) > 40:
				return invalid(k, "parameter_invalid_string_too_long", "Metadata keys can be at most 40 characters.")
			case len(v) > 500:
				return invalid(k, "parameter_invalid_string_too_long", "Metadata values can be at most 500 characters.")
			case v != "":
				meta[mk] = v
			}
		}
	}
	if len(meta) > 50 {
		return invalid("metadata", "parameter_invalid_too_many", "You may only specify 50 keys in metadata.")
	}
	if !p.Has("amount") {
		return invalid("amount", "parameter_missing", "Missing required param: amount.")
	}
	amount, err := strconv.ParseInt(p.Get("amount"), 10, 64)
	if err != nil {
		return invalid("amount", "parameter_invalid_integer", "Invalid integer: "+p.Get("amount"))
	}
	if amount < 1 {
		return invalid("amount", "parameter_invalid_integer", "This value must be greater than or equal to 1.")
	}
	if !p.Has("currency") {
		return invalid("currency", "parameter_missing", "Missing required param: currency.")
	}
	currency := strings.ToLower(p.Get("currency"))
	if len(currency) != 3 || strings.Trim(currency, "abcdefghijklmnopqrstuvwxyz") != "" {
		return invalid("currency", "", "Invalid currency: "+p.Get("currency")+". Stripe currently supports these currencies: usd, eur, gbp, ...")
	}
	confirm := false
	if v := p.Get("confirm"); v != "" {
		if confirm, err = strconv.ParseBool(v); err != nil {
			return invalid("confirm", "parameter_invalid_boolean", "Invalid boolean: "+v)
		}
	}
	pm := p.Get("payment_method")
	if pm != "" && !strings.HasPrefix(pm, "pm_") {
		return invalid("payment_method", "resource_missing", fmt.Sprintf("No such PaymentMethod: '%s'", pm))
	}
	if confirm && pm == "" {
		return invalid("payment_method", "payment_intent_unexpected_state",
			"You cannot confirm this PaymentIntent because it's missing a payment method. You can either update the PaymentIntent with a payment method and then confirm it again, or confirm it again directly with a payment method.")
	}
	captureMethod := cmp.Or(p.Get("capture_method"), "automatic")
	if captureMethod != "automatic" && captureMethod != "automatic_async" && captureMethod != "manual" {
		return invalid("capture_method", "", "Invalid capture_method: must be one of automatic, automatic_async, or manual")
	}

	now := s.opts.Now()
	pi := &paymentIntent{
		ID: newID("pi_"), Object: "payment_intent", Amount: amount, CaptureMethod: captureMethod,
		ConfirmationMethod: cmp.Or(p.Get("confirmation_method"), "automatic"), Created: now.Unix(), Currency: currency,
		Customer: opt(p.Get("customer")), Description: opt(p.Get("description")), Metadata: meta,
		PaymentMethod: opt(pm), PaymentMethodTypes: []string{"card"}, ReceiptEmail: opt(p.Get("receipt_email")),
		StatementDescriptor: opt(p.Get("statement_descriptor")), StatementDescriptorSuffix: opt(p.Get("statement_descriptor_suffix")),
		TransferGroup: opt(p.Get("transfer_group")), Status: "requires_payment_method", at: now,
	}
	pi.ClientSecret = pi.ID + "_secret_" + newID("")
	status := http.StatusOK
	var declineErr *apiError
	switch d, declined := declines[pm]; {
	case pm != "" && !confirm:
		pi.Status = "requires_confirmation"
	case declined:
		ch := newID("ch_")
		pi.LatestCharge, pi.PaymentMethod = &ch, nil
		pi.LastPaymentError = withDoc(&apiError{Type: "card_error", Code: d.code, DeclineCode: d.declineCode, Message: d.message, Charge: ch})
		declineErr = new(*pi.LastPaymentError)
		declineErr.PaymentIntent = pi
		status = http.StatusPaymentRequired
	case confirm:
		ch := newID("ch_")
		pi.LatestCharge, pi.charged = &ch, true
		if captureMethod == "manual" {
			pi.Status, pi.AmountCapturable = "requires_capture", amount
		} else {
			pi.Status, pi.AmountReceived = "succeeded", amount
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.intents[pi.ID] = pi
	s.ordered = append(s.ordered, pi)
	if pi.charged {
		s.charges++
		if idemKey != "" {
			s.byKey[idemKey]++
		}
	}
	return pi, status, declineErr
}

// opt returns nil for "" (JSON null, as Stripe renders unset fields) or &v.
func opt(v string) *string {
	if v == "" {
		return nil
	}
	return &v
}
