package temporalstart_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/outbox/temporalstart"
)

// InvoiceInput is a workflow input: identifiers and a version.
type InvoiceInput struct {
	V         int    `json:"v"`
	TenantID  string `json:"tenant_id"`
	InvoiceID string `json:"invoice_id"`
}

var tenantAttr = temporal.NewSearchAttributeKeyKeyword("TenantID")

// A workflow of your own through the outbox: enqueue its start in the
// transaction that writes the invoice, and run a relay whose Starter adds
// the tenant search attribute to every start.
func Example() {
	ctx := context.Background()
	var (
		pool *pgxpool.Pool // migrated with migrations.Apply
		c    client.Client // dialled with client.Dial
	)
	if pool == nil || c == nil {
		return // a sketch: connect both to run it
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// … write the invoice row in tx …
		in := InvoiceInput{V: 1, TenantID: "acme", InvoiceID: "inv-7"}
		payload, err := json.Marshal(in)
		if err != nil {
			return err
		}
		_, err = outbox.EnqueueTx(ctx, tx, outbox.Request{
			WorkflowType: "InvoiceWorkflow",
			WorkflowID:   "invoice:acme:inv-7:send",
			Payload:      payload,
			TenantID:     in.TenantID,
		})
		return err
	})
	if err != nil {
		fmt.Println("enqueue:", err)
		return
	}
	starter := temporalstart.New(c, &temporalstart.Opts{
		TaskQueue: "invoices",
		Configure: func(_ context.Context, req outbox.Request, o *client.StartWorkflowOptions) error {
			o.TypedSearchAttributes = temporal.NewSearchAttributes(tenantAttr.ValueSet(req.TenantID))
			return nil
		},
	})
	relay, err := outbox.NewRelay(pool, starter, nil)
	if err != nil {
		fmt.Println("relay:", err)
		return
	}
	if err := relay.Run(ctx); err != nil { // until ctx is done
		fmt.Println("relay:", err)
	}
}
