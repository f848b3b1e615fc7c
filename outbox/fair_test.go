package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

// orderedStarter records the workflow IDs it is asked to start, in order.
type orderedStarter struct {
	next outbox.Starter
	mu   sync.Mutex
	ids  []string
}

func (s *orderedStarter) Start(ctx context.Context, req outbox.Request) (*outbox.Started, error) {
	s.mu.Lock()
	s.ids = append(s.ids, req.WorkflowID)
	s.mu.Unlock()
	return s.next.Start(ctx, req)
}

func (s *orderedStarter) started() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ids)
}

// createTenantOrders commits n orders of tenant, each with its outbox row,
// in one transaction, and returns their workflow IDs in order.
func (b *bundle) createTenantOrders(t *testing.T, tenant string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for i := range ids {
			o := b.newOrder(fmt.Sprintf("ord_%04d", i))
			o.TenantID = tenant
			if _, _, err := b.store.CreateAndEnqueueTx(b.ctx, tx, o); err != nil {
				return err
			}
			ids[i] = orders.WorkflowID(tenant, o.ID)
		}
		return nil
	})
	require.NoError(t, err)
	return ids
}

// fairRelay returns a relay over the bundle that starts one row at a time,
// so that the order of its starts is the order of its claims, recording
// that order; with fifo, it claims as the relay did before the fair claim.
func (b *bundle) fairRelay(t *testing.T, batch int, fifo bool) (*outbox.Relay, *orderedStarter) {
	t.Helper()
	rec := &orderedStarter{next: b.starter}
	r, err := outbox.NewRelay(b.pool, rec, &outbox.RelayOpts{BatchSize: batch, Concurrency: 1, Logger: b.logger})
	require.NoError(t, err)
	if fifo {
		r.UseFIFOClaimForTest()
	}
	return r, rec
}

// Tenant A commits 300 orders, then tenant B one: the relay's first batch
// of 10 starts B's order second, right after A's first. The FIFO claim the
// relay had before leaves B behind all 300 (the test's premise).
func TestABacklogDoesNotDelayAnotherTenantsFirstRow(t *testing.T) {
	t.Parallel()
	for _, fifo := range []bool{false, true} {
		t.Run(fmt.Sprintf("fifo=%v", fifo), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tenantA, tenantB := b.tenant, "b"+randomID(4)
			a := b.createTenantOrders(t, tenantA, 300)
			bID := b.createTenantOrders(t, tenantB, 1)[0]
			r, rec := b.fairRelay(t, 10, fifo)

			n, err := r.Poll(b.ctx)
			require.NoError(t, err)
			require.Equal(t, 10, n)
			first := rec.started()
			if fifo {
				require.Equal(t, a[:10], first, "the FIFO claim takes the oldest rows, all A's")
				return
			}
			require.Equal(t, []string{a[0], bID}, first[:2], "B's only row goes right after A's first")
			require.Equal(t, a[1:9], first[2:], "then A's rows, in order")
			entry, err := outbox.Get(b.ctx, b.pool, bID)
			require.NoError(t, err)
			require.NotNil(t, entry.SentAt, "B's row is marked sent")
		})
	}
}

// Two tenants with backlogs take turns, one row each, for as long as both
// have rows waiting, in Run as in Poll; A's longer backlog then drains in
// order.
func TestRelayRunTakesTenantsInTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenantA, tenantB := b.tenant, "b"+randomID(4)
	a := b.createTenantOrders(t, tenantA, 60)
	bIDs := b.createTenantOrders(t, tenantB, 20)
	r, rec := b.fairRelay(t, 0, false)

	b.runUntilSent(t, r)

	var want []string
	for i := range bIDs {
		want = append(want, a[i], bIDs[i])
	}
	want = append(want, a[len(bIDs):]...)
	require.Equal(t, want, rec.started())
}

// A tenant whose first row arrives while another tenant's backlog drains
// joins the round the relay is at: it takes turns with the backlog instead
// of jumping ahead of it with a run of its own. A row without a tenant
// counts as a tenant of its own.
func TestALateTenantJoinsTheCurrentRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenantA, tenantC := b.tenant, "c"+randomID(4)
	a := b.createTenantOrders(t, tenantA, 100)
	r, _ := b.fairRelay(t, 50, false)
	n, err := r.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 50, n, "A's rounds 0 to 49 are sent")

	c := b.createTenantOrders(t, tenantC, 10)
	plain := outbox.Request{WorkflowType: "PlainWorkflow", WorkflowID: "plain:" + randomID(4), Payload: json.RawMessage(`{}`)}
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := outbox.EnqueueTx(b.ctx, tx, plain)
		return err
	}))
	r, rec := b.fairRelay(t, 9, false)
	_, err = r.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, []string{a[50], c[0], plain.WorkflowID, a[51], c[1], a[52], c[2], a[53], c[3]}, rec.started())
}
