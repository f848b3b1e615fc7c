package idempotency_test

// This file is docs/api.md's example, compiled and run: the start route of
// a third pipeline, POST /v1/subscriptions, written as a team writes its
// own handler. The middleware gives it keyed's Idempotency-Key semantics;
// Request.StartTx enqueues the run's start and stores the response in the
// handler's transaction, beside its own row.

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyedhq/keyed/idempotency"
	"github.com/keyedhq/keyed/outbox"
)

// SubscriptionInput is the subscription pipeline's workflow input:
// identifiers and a version.
type SubscriptionInput struct {
	V              int    `json:"v"`
	TenantID       string `json:"tenant_id"`
	SubscriptionID string `json:"subscription_id"`
}

// WorkflowID derives the run's ID from the business event, so that a
// repeated start collapses into the first run.
func (in SubscriptionInput) WorkflowID() string {
	return "subscription:" + in.TenantID + ":" + in.SubscriptionID + ":activate"
}

// createSubscription serves POST /v1/subscriptions behind the middleware:
// one transaction writes the subscription row, enqueues its run's start
// and stores the 201 that a retry replays.
func createSubscription(pool *pgxpool.Pool, idem *idempotency.Middleware) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := idempotency.FromContext(r.Context()) // the request's hold on its key
		var req struct {
			ID   string `json:"subscription_id"`
			Plan string `json:"plan"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ID == "" || req.Plan == "" {
			// Answered without storing: the key is released for a corrected retry.
			idempotency.WriteError(w, idempotency.NewError(http.StatusBadRequest, "invalid_json", "",
				`send {"subscription_id":"…","plan":"…"}`))
			return
		}
		in := SubscriptionInput{V: 1, TenantID: q.Tenant(), SubscriptionID: req.ID}
		payload, err := json.Marshal(in)
		if err != nil {
			idem.Fail(w, r, "create subscription", err)
			return
		}
		resp, err := idempotency.JSON(http.StatusCreated, map[string]string{
			"subscription_id": req.ID, "plan": req.Plan, "workflow_id": in.WorkflowID()})
		if err != nil {
			idem.Fail(w, r, "create subscription", err)
			return
		}
		resp.Header = http.Header{"Location": {"/v1/subscriptions/" + req.ID}}
		err = pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(r.Context(), `INSERT INTO subscriptions (tenant_id, id, plan) VALUES ($1, $2, $3)`,
				in.TenantID, req.ID, req.Plan); err != nil {
				return err
			}
			return q.StartTx(r.Context(), tx, outbox.Request{WorkflowType: "SubscriptionWorkflow",
				WorkflowID: in.WorkflowID(), Payload: payload}, resp)
		})
		if err != nil {
			idem.Fail(w, r, "create subscription", err) // 503 / 500 / 409 after a lost lease; the key is released
			return
		}
		resp.Write(w)
	}
}

// tenantKey carries the tenant authenticate resolved.
type tenantKey struct{}

// authenticate stands in for your own authentication: it resolves the
// caller's bearer key to a tenant.
func authenticate(tenants map[string]string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant, ok := tenants[r.Header.Get("Authorization")]
		if !ok {
			idempotency.WriteError(w, idempotency.NewError(http.StatusUnauthorized, "unauthorized", "", "unknown API key"))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

// subscriptionsAPI is the team's mux: authentication, then the key, then
// the handler.
func subscriptionsAPI(pool *pgxpool.Pool, tenants map[string]string) (http.Handler, error) {
	idem, err := idempotency.New(pool, &idempotency.Opts{
		Tenant: func(r *http.Request) string { s, _ := r.Context().Value(tenantKey{}).(string); return s },
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/subscriptions", authenticate(tenants, idem.Wrap(createSubscription(pool, idem))))
	return mux, nil
}
