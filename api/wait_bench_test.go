package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyedhq/keyed/api"
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
