package tests

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

// stormAPI is keyed's HTTP API on the world's database with a relay
// starting its outbox rows on the world's task queue, as in production.
type stormAPI struct {
	world  *bundle
	srv    *httptest.Server
	key    string
	ins    []orders.OrderInput
	mu     sync.Mutex
	status map[int]int
}

func newStormAPI(b *testing.B, world *bundle) *stormAPI {
	b.Helper()
	s := &stormAPI{world: world, key: "sk_test_" + randomID() + randomID()}
	keys, err := api.ParseKeys(world.tenant + "=" + s.key)
	require.NoError(b, err)
	h, err := api.NewHandler(world.pool, keys, &api.HandlerOpts{Effects: world.effects, Logger: quiet()})
	require.NoError(b, err)
	s.srv = httptest.NewServer(h)
	b.Cleanup(s.srv.Close)
	s.srv.Client().Transport.(*http.Transport).MaxIdleConnsPerHost = stormStarts
	relay, err := outbox.NewRelay(world.pool, pipeline.Starter(world.temporal, world.pool, world.taskQueue, workflows.Pipelines()),
		&outbox.RelayOpts{Logger: quiet(), PollInterval: 20 * time.Millisecond})
	require.NoError(b, err)
	require.NoError(b, relay.Start(world.ctx))
	b.Cleanup(func() { _ = relay.Stop(world.ctx) })
	return s
}

// storm posts stormStarts concurrent order requests, stormStarts/stormOrders
// per order, each order's with the same body and Idempotency-Key, and
// returns the POST latencies.
func (s *stormAPI) storm(b *testing.B, prefix string) batch {
	b.Helper()
	s.ins, s.status = nil, map[int]int{}
	for k := range stormOrders {
		s.ins = append(s.ins, orders.NewOrderInput(s.world.tenant, fmt.Sprintf("%s-%d", prefix, k)))
	}
	return storm(b, func(i int) error {
		in := s.ins[i%stormOrders]
		body := fmt.Sprintf(`{"order_id":%q,"amount_minor":%d,"currency":"eur","customer_email":"ada@example.com","payment_method":"pm_card_visa"}`,
			in.OrderID, 1000+i%stormOrders)
		req, err := http.NewRequest(http.MethodPost, s.srv.URL+"/v1/orders", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+s.key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(api.HeaderIdempotencyKey, "storm-"+in.OrderID)
		resp, err := s.srv.Client().Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		s.mu.Lock()
		s.status[resp.StatusCode]++
		s.mu.Unlock()
		if resp.StatusCode >= 500 {
			return fmt.Errorf("POST /v1/orders %s: status %d", in.OrderID, resp.StatusCode)
		}
		return nil
	})
}

// settle waits for the relay to start every order's run and for the runs to
// finish, and returns how many runs the orders have.
func (s *stormAPI) settle(b *testing.B) int {
	b.Helper()
	runs := 0
	for _, in := range s.ins {
		require.Eventually(b, func() bool {
			_, err := s.world.temporal.DescribeWorkflow(s.world.ctx, in.WorkflowID(), "")
			return err == nil
		}, time.Minute, 50*time.Millisecond, "the relay starts %s", in.WorkflowID())
		require.NoError(b, s.world.temporal.GetWorkflow(s.world.ctx, in.WorkflowID(), "").Get(s.world.ctx, nil))
		runs += countRuns(b, s.world, in.WorkflowID())
	}
	return runs
}

func (s *stormAPI) statuses() map[int]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}
