package fakestripe

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
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

// createPaymentIntent is the executor of POST /v1/payment_intents.
func (s *Server) createPaymentIntent(p url.Values, idemKey string) (any, int, *apiError, bool) {
	pi, status, apiErr := s.execute(p, idemKey)
	if pi == nil {
		return nil, status, apiErr, false
	}
	return pi, status, apiErr, true
}

// execute validates params and creates a payment intent, charging it when
// confirmed. It returns the intent, or an error with a nil intent when
// nothing was created; a decline returns both.
func (s *Server) execute(p url.Values, idemKey string) (*paymentIntent, int, *apiError) {
	invalid := func(param, code, msg string) (*paymentIntent, int, *apiError) {
		return nil, http.StatusBadRequest, &apiError{Type: "invalid_request_error", Param: param, Code: code, Message: msg}
	}
	meta, apiErr := parseParams(p, knownParams)
	if apiErr != nil {
		return nil, http.StatusBadRequest, apiErr
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

// parseParams refuses a parameter whose name is not in known and returns
// the metadata[...] parameters, refusing keys and values longer than Stripe
// allows and more than 50 keys. Empty values are left out, as Stripe unsets
// them.
func parseParams(p url.Values, known map[string]bool) (map[string]string, *apiError) {
	invalid := func(param, code, msg string) (map[string]string, *apiError) {
		return nil, &apiError{Type: "invalid_request_error", Param: param, Code: code, Message: msg}
	}
	meta := map[string]string{}
	for k := range p {
		name, _, _ := strings.Cut(k, "[")
		if !known[name] {
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
	return meta, nil
}

// opt returns nil for "" (JSON null, as Stripe renders unset fields) or &v.
func opt(v string) *string {
	if v == "" {
		return nil
	}
	return &v
}
