package order_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

// stripeMockVersion is the stripe-mock the Makefile builds into bin/.
const stripeMockVersion = "v0.203.0"

// startStripeMock runs stripe-mock on free loopback ports until the test
// ends and returns its HTTP base URL. It fails the test, saying how to build
// the binary, when there is none.
func startStripeMock(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	bin := os.Getenv("KEYED_STRIPE_MOCK_BIN")
	if bin == "" {
		bin = filepath.Join(root, "bin", "stripe-mock")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("stripe-mock not found at %s (%v).\nBuild it with `make tools`, or `GOBIN=%s go install github.com/stripe/stripe-mock@%s`, "+
			"or point KEYED_STRIPE_MOCK_BIN at a stripe-mock binary.", bin, err, filepath.Join(root, "bin"), stripeMockVersion)
	}
	addrs := freeAddrs(t, 2)
	httpAddr, httpsAddr := addrs[0], addrs[1]
	cmd := exec.Command(bin, "-http-addr", httpAddr, "-https-addr", httpsAddr)
	out := &syncWriter{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", httpAddr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return "http://" + httpAddr
		}
		if time.Now().After(deadline) {
			t.Fatalf("stripe-mock did not listen on %s within 20s; output:\n%s", httpAddr, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freeAddrs returns n distinct free loopback addresses, holding every
// listener until all are picked so that none is handed out twice.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	return addrs
}

// TestStripeMockContract runs Charge's Stripe requests against stripe-mock,
// which checks every request against Stripe's OpenAPI spec and answers 400
// for a parameter Stripe would refuse. stripe-mock answers with fixtures, so
// its payment intent never reaches succeeded: the full activity therefore
// stops with PaymentIncomplete, which proves the request was accepted.
func TestStripeMockContract(t *testing.T) {
	t.Parallel()
	base := startStripeMock(t)
	b := setup(t)
	api, err := stripestep.NewClient("sk_test_123", base, nil) // The shape stripe-mock accepts.
	require.NoError(t, err)
	quiet := slog.New(slog.DiscardHandler)
	acts, err := ordersteps.New(pipeline.Deps{DB: b.pool, Effects: b.claims, Logger: quiet, Providers: []any{api, senderFor(t, b)}})
	require.NoError(t, err)
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(quiet))
	env := suite.NewTestActivityEnvironment()
	require.NoError(t, step.Register(env, acts.Definitions()...))
	env.RegisterActivityWithOptions(func(ctx context.Context, in orders.OrderInput) (string, error) {
		pi, err := ordersteps.CreateChargeForTest(ctx, acts, in)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s %d %s", pi.PaymentMethod.ID, pi.Amount, pi.Currency), nil
	}, activity.RegisterOptions{Name: "ContractCreate"})
	env.RegisterActivityWithOptions(func(ctx context.Context, in orders.OrderInput) (string, error) {
		pi, err := ordersteps.FindChargeForTest(ctx, acts, in)
		if err != nil || pi == nil {
			return "", err
		}
		return pi.ID, nil
	}, activity.RegisterOptions{Name: "ContractSearch"})
	in := b.order(t, "9f3a", "pm_card_visa")

	// The create request: accepted, and its parameters reflected back.
	val, err := env.ExecuteActivity("ContractCreate", in)
	require.NoError(t, err, "stripe-mock refused the create request")
	var created string
	require.NoError(t, val.Get(&created))
	require.Equal(t, "pm_card_visa 1250 eur", created)

	// The search request of a takeover: accepted. Its fixture hit has
	// neither our effect key nor status succeeded, so nothing is found.
	val, err = env.ExecuteActivity("ContractSearch", in)
	require.NoError(t, err, "stripe-mock refused the search request")
	var found string
	require.NoError(t, val.Get(&found))
	require.Empty(t, found)

	// The whole activity.
	_, err = env.ExecuteActivity(ordersteps.NameCharge, in)
	app := requireTerminal(t, err, step.ErrTypePaymentIncomplete)
	require.Contains(t, app.Error(), "requires_payment_method")
}

// syncWriter collects a child process's output for a failure message.
type syncWriter struct {
	mu  sync.Mutex
	buf []byte
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	return len(p), nil
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}
