//go:build cluster

package tests

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/pgcluster"
	"github.com/keyedhq/keyed/orders"
)

// The burst: rateOrders orders created and started at once, against fakes
// that answer 429 to every API call beyond rateCap in a wall-clock second,
// with the workers bounding each provider to rateBound calls a second.
const (
	rateOrders  = 1000
	rateCap     = 25 // Stripe's test-mode limit
	rateBound   = 20
	rateWorkers = 3
)

// TestProviderRateLimitBurst starts 1000 orders at once on three worker
// processes against fakes that 429 above 25 calls a second: first with no
// bound (figures only), then with STRIPE_CALLS_PER_SECOND and
// SENDGRID_CALLS_PER_SECOND at 20, where at most 1% of the calls may meet
// a 429; both settle with one charge and one receipt per order.
func TestProviderRateLimitBurst(t *testing.T) {
	bin := buildWorker(t)
	for _, bound := range []int{0, rateBound} {
		t.Run(fmt.Sprintf("calls_per_second=%d", bound), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
			defer cancel()
			pg := pgcluster.New(t, &pgcluster.Opts{Settings: map[string]string{"max_connections": "300"}})
			w := newFaultWorldOn(t, ctx, bin, config.AtLeastOnce, pg, temporalAddr, rateWorkers)
			stripe, mail := &perSecondCap{h: w.stripe, per: rateCap}, &perSecondCap{h: w.mail, per: rateCap}
			for _, s := range []struct {
				h   http.Handler
				url *string
			}{{stripe, &w.stripeURL}, {mail, &w.mailURL}} {
				srv := httptest.NewServer(s.h)
				t.Cleanup(srv.Close)
				*s.url = srv.URL
			}
			if bound > 0 {
				w.env = []string{"STRIPE_CALLS_PER_SECOND=" + strconv.Itoa(bound), "SENDGRID_CALLS_PER_SECOND=" + strconv.Itoa(bound)}
			}
			for i := range rateWorkers {
				require.NoError(t, w.spawn(i))
			}
			w.began = time.Now()
			var (
				next atomic.Int64
				wg   sync.WaitGroup
				errs = make(chan error, rateOrders)
			)
			for range 50 {
				wg.Go(func() {
					for i := next.Add(1) - 1; i < rateOrders; i = next.Add(1) - 1 {
						id := fmt.Sprintf("r%04d", i)
						if err := w.createAndStart(ctx, id); err != nil {
							errs <- fmt.Errorf("order %s: %w", id, err)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("start: %v", err)
			}
			startedIn := time.Since(w.began)
			settledIn, settleErr := w.waitSettled(ctx, 10*time.Minute)
			var paid int
			require.NoError(t, retryDB(ctx, func(ctx context.Context) error {
				return w.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE tenant_id = $1 AND status = 'paid'`, w.tenant).Scan(&paid)
			}))
			st, sg := stripe.figures(), mail.figures()
			t.Logf("rate figures: bound=%d/s cap=%d/s workers=%d orders=%d started_in=%s settled_in=%s paid=%d charges=%d receipts=%d "+
				"stripe_calls=%d stripe_429=%d (%.2f%%) stripe_peak=%d/s sendgrid_calls=%d sendgrid_429=%d (%.2f%%) sendgrid_peak=%d/s",
				bound, rateCap, rateWorkers, rateOrders, startedIn.Round(100*time.Millisecond), settledIn.Round(time.Second), paid,
				w.stripe.Charges(), w.mail.Count(), st.calls, st.limited, st.pct(), st.peak, sg.calls, sg.limited, sg.pct(), sg.peak)
			require.NoError(t, settleErr)
			require.Equal(t, rateOrders, paid, "orders paid")
			require.Equal(t, rateOrders, w.stripe.Charges(), "one charge per order")
			require.Equal(t, rateOrders, w.mail.Count(), "one receipt per order")
			require.GreaterOrEqual(t, st.calls, rateOrders, "every order's charge went through the capped Stripe")
			require.GreaterOrEqual(t, sg.calls, rateOrders, "every order's receipt went through the capped SendGrid")
			if bound == 0 {
				require.Positive(t, st.limited, "the unbounded workers met Stripe's 429s")
			}
			if bound > 0 {
				require.LessOrEqual(t, st.pct(), 1.0, "Stripe calls answered 429 (%)")
				require.LessOrEqual(t, sg.pct(), 1.0, "SendGrid calls answered 429 (%)")
			}
		})
	}
}

// createAndStart creates order id and starts its run once.
func (w *faultWorld) createAndStart(ctx context.Context, id string) error {
	err := retryDB(ctx, func(ctx context.Context) error {
		_, _, err := w.orders.Create(ctx, orders.NewOrder{TenantID: w.tenant, ID: id, AmountMinor: 1999, Currency: "eur",
			CustomerEmail: "ada+" + id + "@example.com", PaymentMethod: "pm_card_visa"})
		return err
	})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	_, err = w.start(ctx, orders.NewOrderInput(w.tenant, id))
	return err
}

// perSecondCap answers 429 to every API call (not the fakes' /_fake
// routes) beyond per in one wall-clock second, as a provider's rate limit
// does, and counts the calls, the 429s and the busiest second.
type perSecondCap struct {
	h   http.Handler
	per int

	mu             sync.Mutex
	second         int64
	inSecond, peak int
	calls, limited int
}

func (c *perSecondCap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/_fake") {
		c.h.ServeHTTP(w, r)
		return
	}
	now := time.Now().Unix()
	c.mu.Lock()
	if now != c.second {
		c.second, c.inSecond = now, 0
	}
	c.inSecond++
	c.calls++
	c.peak = max(c.peak, c.inSecond)
	over := c.inSecond > c.per
	if over {
		c.limited++
	}
	c.mu.Unlock()
	if over {
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests"},"errors":[{"message":"too many requests"}]}`))
		return
	}
	c.h.ServeHTTP(w, r)
}

type capFigures struct{ calls, limited, peak int }

func (f capFigures) pct() float64 {
	if f.calls == 0 {
		return 0
	}
	return 100 * float64(f.limited) / float64(f.calls)
}

func (c *perSecondCap) figures() capFigures {
	c.mu.Lock()
	defer c.mu.Unlock()
	return capFigures{calls: c.calls, limited: c.limited, peak: c.peak}
}
