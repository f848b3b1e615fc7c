package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/idempotency"
	"github.com/keyedhq/keyed/orders"
)

// LegacyCreateOrderForTest mounts, at POST /bench/legacy-orders, POST
// /v1/orders as it ran before the idempotency middleware (commit 7ebef76):
// the same claim, transaction and replay inline in the handler. It is the
// baseline BenchmarkCreateOrder measures the middleware beside.
func (h *Handler) LegacyCreateOrderForTest() error {
	claims, err := effects.NewClient(h.db, &effects.ClientOpts{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	h.mux.Handle("POST /bench/legacy-orders", h.authed(func(w http.ResponseWriter, r *http.Request, tenant string) {
		key, problem := idempotency.ParseKey(r.Header.Get(HeaderIdempotencyKey))
		if problem != "" {
			writeError(w, newError(http.StatusBadRequest, CodeInvalidIdempotencyKey, HeaderIdempotencyKey, "Idempotency-Key %s", problem))
			return
		}
		no, aerr := h.decodeCreate(w, r)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		no.TenantID = tenant
		if err := no.Validate(); err != nil {
			writeError(w, newError(http.StatusBadRequest, CodeInvalidField, "", "%v", err))
			return
		}
		ikey, err := idempotency.StoredKey(tenant, key)
		if err != nil {
			writeError(w, newError(http.StatusInternalServerError, CodeInternal, "", "key"))
			return
		}
		owner := randomID(6)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.timeout)
		defer cancel()
		cl, err := claims.Claim(ctx, effects.ClaimParams{Key: ikey, Kind: KindAPIRequest, Owner: owner,
			Fingerprint: requestHash(RouteCreateOrder, no), Lease: DefaultRequestLease, MaxResultBytes: 64 << 10, AsyncCommit: true})
		switch {
		case errors.Is(err, effects.ErrKeyReused):
			writeError(w, newError(http.StatusUnprocessableEntity, CodeIdempotencyKeyReused, HeaderIdempotencyKey, "reused"))
			return
		case errors.Is(err, effects.ErrInProgress):
			w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
			writeError(w, newError(http.StatusConflict, CodeRequestInProgress, HeaderIdempotencyKey, "in progress"))
			return
		case err != nil:
			h.dbFailure(w, r, "claim idempotency key", err)
			return
		case cl.Done:
			var st struct {
				Status int             `json:"status"`
				Body   json.RawMessage `json:"body"`
			}
			if err := cl.Decode(&st); err != nil {
				h.dbFailure(w, r, "replay", err)
				return
			}
			body, err := replayWith(orderRenderer(tenant, no), st.Body)
			if err != nil {
				h.dbFailure(w, r, "replay", err)
				return
			}
			w.Header().Set(HeaderReplayed, "true")
			writeJSON(w, st.Status, body)
			return
		}
		var status int
		var body []byte
		err = pgx.BeginFunc(ctx, h.db, func(tx pgx.Tx) error {
			order, created, err := h.store.CreateAndEnqueueTx(ctx, tx, no)
			if err != nil {
				return err
			}
			if body, err = encodeBody(OrderCreated{Order: order, WorkflowID: orders.WorkflowID(tenant, order.ID)}); err != nil {
				return err
			}
			status = http.StatusOK
			if created {
				status = http.StatusCreated
			}
			// The old storedOf: the body must render from the outcome.
			if got, err := orderRenderer(tenant, no)(orderOutcomeOf(order)); err != nil || !bytes.Equal(got, body) {
				return errors.New("not rendered")
			}
			out, err := json.Marshal(orderOutcomeOf(order))
			if err != nil {
				return err
			}
			return claims.CompleteTx(ctx, tx, cl, struct {
				Status int             `json:"status"`
				Body   json.RawMessage `json:"body"`
			}{status, out})
		})
		if err != nil {
			_, _ = claims.Release(ctx, ikey, owner, &effects.ReleaseOpts{Kind: idempotency.Kind})
			h.dbFailure(w, r, "create order", err)
			return
		}
		writeJSON(w, status, body)
	}))
	return nil
}
