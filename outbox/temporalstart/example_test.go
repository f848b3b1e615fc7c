package temporalstart_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/migrations"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/outbox/temporalstart"
)

// temporalAddr is the dev server the package's examples share.
var temporalAddr string

func TestMain(m *testing.M) {
	os.Exit(devserver.RunTests(m, "outbox/temporalstart", func(s *devserver.Server) { temporalAddr = s.Address() }))
}

// InvoiceInput is a workflow input: identifiers and a version.
type InvoiceInput struct {
	V         int    `json:"v"`
	TenantID  string `json:"tenant_id"`
	InvoiceID string `json:"invoice_id"`
}

// InvoiceWorkflow is a workflow of your own.
func InvoiceWorkflow(_ workflow.Context, in InvoiceInput) (string, error) {
	return "invoice " + in.InvoiceID + " sent for " + in.TenantID, nil
}

var tenantAttr = temporal.NewSearchAttributeKeyKeyword("TenantID")

// A workflow of your own through the outbox: enqueue its start in the
// transaction that writes the invoice, and run a relay whose Starter adds
// the tenant search attribute to every start. Enqueueing the same workflow
// ID again is a no-op, and so is starting it again.
func Example() {
	ctx := context.Background()
	pool, c, stop := exampleDeps(ctx) // migrated with migrations.Apply; dialled with client.Dial
	defer stop()
	w := worker.New(c, "invoices", worker.Options{})
	w.RegisterWorkflow(InvoiceWorkflow)
	if err := w.Start(); err != nil {
		panic(err)
	}
	defer w.Stop()

	in := InvoiceInput{V: 1, TenantID: "acme", InvoiceID: "inv-7"}
	payload, err := json.Marshal(in)
	if err != nil {
		panic(err)
	}
	req := outbox.Request{
		WorkflowType: "InvoiceWorkflow",
		WorkflowID:   "invoice:acme:inv-7:send",
		Payload:      payload,
		TenantID:     in.TenantID,
	}
	for range 2 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// … write the invoice row in tx …
			enqueued, err := outbox.EnqueueTx(ctx, tx, req)
			fmt.Println("enqueued:", enqueued)
			return err
		})
		if err != nil {
			panic(err)
		}
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
		panic(err)
	}
	// A service runs relay.Run(ctx) until it stops; one pass here.
	sent, err := relay.Poll(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("started:", sent)

	var out string
	if err := c.GetWorkflow(ctx, req.WorkflowID, "").Get(ctx, &out); err != nil {
		panic(err)
	}
	fmt.Println(out)

	again, err := starter.Start(ctx, req)
	if err != nil {
		panic(err)
	}
	fmt.Println("started again:", again.Created)
	// Output:
	// enqueued: true
	// enqueued: false
	// started: 1
	// invoice inv-7 sent for acme
	// started again: false
}

// exampleDeps returns a pool on a new schema with keyed's tables, a
// Temporal client of the package's dev server, and a function that closes
// both and drops the schema. A real service connects to its own database
// and cluster instead.
func exampleDeps(ctx context.Context) (*pgxpool.Pool, client.Client, func()) {
	pool, drop := effectstest.NewExamplePool(ctx)
	quiet := slog.New(slog.DiscardHandler)
	if _, err := migrations.Apply(ctx, pool, &migrations.Opts{Logger: quiet}); err != nil {
		panic(err)
	}
	c, err := client.Dial(client.Options{HostPort: temporalAddr, Logger: log.NewStructuredLogger(quiet)})
	if err != nil {
		panic(err)
	}
	return pool, c, func() {
		c.Close()
		drop()
	}
}
