package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/idempotency"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// Retention is how long a stored response stays replayable: 24 hours, as
// at Stripe (idempotency.Retention). After that the key may be used afresh.
const Retention = idempotency.Retention

// DefaultRequestLease is how long a request holds its Idempotency-Key before
// another request may take it over (idempotency.DefaultLease).
const DefaultRequestLease = idempotency.DefaultLease

// MaxIdempotencyKeyLen is the longest Idempotency-Key accepted, in bytes.
const MaxIdempotencyKeyLen = idempotency.MaxKeyLen

// KindAPIRequest is the effect kind of an HTTP request's Idempotency-Key
// record in keyed_effects (idempotency.Kind).
const KindAPIRequest = idempotency.Kind

// PruneOpts configures Prune.
type PruneOpts = idempotency.PruneOpts

// Prune deletes idempotency records older than the retention; see
// idempotency.Prune.
func Prune(ctx context.Context, db effects.DB, opts *PruneOpts) (int64, error) {
	return idempotency.Prune(ctx, db, opts)
}

// newIdempotency returns the middleware keyed's POST routes share: keys
// bound to the tenant authed resolved, records owned by the request ID,
// outcomes counted in keyed_api_idempotency_total.
func (h *Handler) newIdempotency(lease time.Duration) (*idempotency.Middleware, error) {
	return idempotency.New(h.db, &idempotency.Opts{
		Tenant: func(r *http.Request) string {
			if p, ok := r.Context().Value(tenantKey).(*string); ok {
				return *p
			}
			return ""
		},
		Lease:   lease,
		Timeout: h.timeout,
		MaxWait: h.maxWait,
		Owner: func(r *http.Request) string {
			id, _ := r.Context().Value(requestIDKey).(string)
			return id
		},
		Observe: h.metrics.idem,
		Logger:  h.logger,
	})
}

// orderRoute is POST /v1/orders's fingerprint and replay: the validated
// order (requestHash), and its body rendered from the stored outcome.
func (h *Handler) orderRoute() *idempotency.RouteOpts {
	return &idempotency.RouteOpts{
		Fingerprint: func(w http.ResponseWriter, r *http.Request) (string, any, error) {
			no, aerr := h.decodeCreate(w, r)
			if aerr != nil {
				return "", nil, aerr
			}
			no.TenantID = tenantOf(r)
			if err := no.Validate(); err != nil {
				var verr *orders.ValidationError
				if errors.As(err, &verr) {
					return "", nil, newError(http.StatusBadRequest, CodeInvalidField, verr.Field, "%s", verr.Reason)
				}
				return "", nil, newError(http.StatusBadRequest, CodeInvalidField, "", "%v", err)
			}
			return requestHash(RouteCreateOrder, no), no, nil
		},
		Replay: func(v any, kept json.RawMessage) ([]byte, error) {
			no := v.(orders.NewOrder)
			return replayWith(orderRenderer(no.TenantID, no), kept)
		},
	}
}

// refundRoute is POST /v1/orders/{id}/refunds's fingerprint and replay.
func (h *Handler) refundRoute() *idempotency.RouteOpts {
	return &idempotency.RouteOpts{
		Fingerprint: func(w http.ResponseWriter, r *http.Request) (string, any, error) {
			req, aerr := h.decodeRefund(w, r)
			if aerr != nil {
				return "", nil, aerr
			}
			in, aerr := refundInput(tenantOf(r), r.PathValue("id"), req)
			if aerr != nil {
				return "", nil, aerr
			}
			return refundHash(in), in, nil
		},
		Replay: func(v any, kept json.RawMessage) ([]byte, error) {
			return replayWith(refundRenderer(v.(refunds.RefundInput)), kept)
		},
	}
}

// replayWith renders a stored outcome with render.
func replayWith(render renderer, kept json.RawMessage) ([]byte, error) {
	out, err := decodeOutcome(kept)
	if err != nil {
		return nil, err
	}
	return render(out)
}

// decodeOutcome reads a stored outcome of the version this binary renders.
func decodeOutcome(kept json.RawMessage) (*outcome, error) {
	var out *outcome
	if err := json.Unmarshal(kept, &out); err != nil {
		return nil, fmt.Errorf("read stored response outcome: %w", err)
	}
	if out == nil || out.V != outcomeVersion {
		return nil, fmt.Errorf("read stored response: no outcome of version %d", outcomeVersion)
	}
	return out, nil
}

// responseOf is the response to send and store for status and body, keeping
// out in place of the body.
func responseOf(status int, out *outcome, body []byte) (idempotency.Response, error) {
	kept, err := json.Marshal(out)
	if err != nil {
		return idempotency.Response{}, fmt.Errorf("store response: %w", err)
	}
	return idempotency.Response{Status: status, Body: body, Kept: kept}, nil
}

// tenantOf returns the tenant authed resolved for r.
func tenantOf(r *http.Request) string {
	if p, ok := r.Context().Value(tenantKey).(*string); ok {
		return *p
	}
	return ""
}
