package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/orders"
)

// pollInterval is how often the polling client of BenchmarkFinalAnswer
// asks GET /v1/orders/{id}.
const pollInterval = 20 * time.Millisecond

// BenchmarkFinalAnswer measures the time from sending POST /v1/orders to
// holding the order's final answer (paid), against the dev server with a
// worker app and zero-latency fakes, at 1 and 16 concurrent clients, side by
// side in one run: with Prefer: wait=10 (answer=wait: the POST's own 201, or
// its 202 and then polling), and as before it (answer=poll: the 201 pending,
// then GET every 20 ms until paid). It reports p50 and p99 in ms and orders
// answered per second.
//
//	go test -run '^$' -bench FinalAnswer -benchtime 60x ./api
func BenchmarkFinalAnswer(b *testing.B) {
	wb := waitSetup(b)
	var seq atomic.Int64
	for _, conc := range []int{1, 16} {
		for _, mode := range []string{"wait", "poll"} {
			b.Run(fmt.Sprintf("answer=%s/conc=%d", mode, conc), func(b *testing.B) {
				prefer := ""
				if mode == "wait" {
					prefer = "wait=10"
				}
				var mu sync.Mutex
				var took []time.Duration
				var next atomic.Int64
				var failed atomic.Value
				var requests atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for range conc {
					wg.Go(func() {
						for next.Add(1) <= int64(b.N) {
							id := fmt.Sprintf("ord_bench_%d", seq.Add(1))
							t0 := time.Now()
							n, err := wb.finalAnswer(b, id, prefer)
							requests.Add(int64(n))
							if err != nil {
								failed.Store(err)
								return
							}
							d := time.Since(t0)
							mu.Lock()
							took = append(took, d)
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				if err, ok := failed.Load().(error); ok {
					b.Fatal(err)
				}
				slices.Sort(took)
				b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
				b.ReportMetric(ms(took[min(len(took)-1, len(took)*99/100)]), "p99-ms")
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "orders/s")
				b.ReportMetric(float64(requests.Load())/float64(b.N), "requests/order")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkFinalAnswerServerConfig measures the same final answer under
// light load (one client, an order every 100 ms) on two dev servers side by
// side: as the CLI ships it, and with devserver.FastDispatch. It reports,
// for each answer (wait, poll), the p50 and p99 of the time to "paid" in
// ms, and the p50 and p90 of the time each run's tasks waited between being
// scheduled and being started, read from the histories.
//
//	go test -run '^$' -bench FinalAnswerServerConfig -benchtime 40x ./api
func BenchmarkFinalAnswerServerConfig(b *testing.B) {
	for _, cfg := range []struct {
		name string
		dyn  map[string]string
	}{{"shipped", nil}, {"fast-dispatch", devserver.FastDispatch()}} {
		b.Run("server="+cfg.name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			srv, err := devserver.Start(ctx, &devserver.Opts{UIPort: -1, DynamicConfig: cfg.dyn})
			cancel()
			require.NoError(b, err)
			b.Cleanup(func() { require.NoError(b, srv.Stop()) })
			wb := waitSetupOn(b, srv)
			for _, mode := range []string{"wait", "poll"} {
				b.Run("answer="+mode, func(b *testing.B) { wb.lightLoad(b, mode) })
			}
		})
	}
}

// lightLoad runs b.N orders one after another, 100 ms apart, answered by
// mode (wait: Prefer: wait=10; poll: GET until paid), and reports the time
// to the answer and the runs' dispatch waits.
func (wb *waitBundle) lightLoad(b *testing.B, mode string) {
	prefer := map[string]string{"wait": "wait=10"}[mode]
	var took, waits []time.Duration
	for i := range b.N {
		id := fmt.Sprintf("ord_light_%s_%d", mode, i)
		t0 := time.Now()
		_, err := wb.finalAnswer(b, id, prefer)
		took = append(took, time.Since(t0))
		require.NoError(b, err)
		waits = append(waits, dispatchWaits(b, wb.w.Client, orders.WorkflowID(wb.tenant, id))...)
		time.Sleep(100 * time.Millisecond)
	}
	slices.Sort(took)
	slices.Sort(waits)
	at := func(d []time.Duration, q int) float64 { return ms(d[min(len(d)-1, len(d)*q/100)]) }
	b.ReportMetric(at(took, 50), "p50-ms")
	b.ReportMetric(at(took, 99), "p99-ms")
	b.ReportMetric(at(waits, 50), "dispatch-p50-ms")
	b.ReportMetric(at(waits, 90), "dispatch-p90-ms")
	b.ReportMetric(0, "ns/op")
}

// dispatchWaits returns, for each workflow and activity task of workflowID's
// history, the time from its scheduling to its start.
func dispatchWaits(b *testing.B, c client.Client, workflowID string) []time.Duration {
	it := c.GetWorkflowHistory(context.Background(), workflowID, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	scheduled := map[enums.EventType]time.Time{}
	startOf := map[enums.EventType]enums.EventType{
		enums.EVENT_TYPE_WORKFLOW_TASK_STARTED: enums.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
		enums.EVENT_TYPE_ACTIVITY_TASK_STARTED: enums.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
	}
	var waits []time.Duration
	for it.HasNext() {
		e, err := it.Next()
		require.NoError(b, err)
		at := e.GetEventTime().AsTime()
		switch t := e.GetEventType(); t {
		case enums.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, enums.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			scheduled[t] = at
		case enums.EVENT_TYPE_WORKFLOW_TASK_STARTED, enums.EVENT_TYPE_ACTIVITY_TASK_STARTED:
			waits = append(waits, at.Sub(scheduled[startOf[t]]))
		}
	}
	return waits
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// finalAnswer posts order id with prefer and, unless the answer says paid,
// polls its GET until it does. It returns how many requests it sent.
func (b *waitBundle) finalAnswer(t testing.TB, id, prefer string) (int, error) {
	r := b.post(t, b.srv.URL, "/v1/orders", "k-"+id, orderBody(id, 1000), prefer)
	if r.status != http.StatusCreated && r.status != http.StatusAccepted {
		return 1, fmt.Errorf("POST %s: %d %s", id, r.status, r.body)
	}
	var oc api.OrderCreated
	if err := json.Unmarshal(r.body, &oc); err != nil {
		return 1, err
	}
	n := 1
	for deadline := time.Now().Add(60 * time.Second); oc.Order.Status != orders.StatusPaid; n++ {
		if time.Now().After(deadline) {
			return n, fmt.Errorf("order %s not paid within 60 s", id)
		}
		time.Sleep(pollInterval)
		g := doAt(t, b.srv.Client(), b.srv.URL, "GET", "/v1/orders/"+id, b.key, "", "")
		if g.status != http.StatusOK {
			return n, fmt.Errorf("GET %s: %d %s", id, g.status, g.body)
		}
		if err := json.Unmarshal(g.body, &oc); err != nil {
			return n, err
		}
	}
	return n, nil
}
