// Command demo runs keyed's order pipeline end to end on this machine: a
// Temporal dev server with its Web UI, Postgres, the real worker binary, and
// fake Stripe and SendGrid (or the real ones when their keys are set). It
// creates a handful of orders, fires duplicate starts at them, and prints
// what happened. Run it through `make demo`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/migrations"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/workflows"
)

const (
	demoSchema = "keyed_demo"
	tenant     = "demo"
	taskQueue  = "keyed-demo"
)

func main() {
	keep := flag.Bool("keep", os.Getenv("KEEP") != "", "keep the dev server, Web UI and worker running until Ctrl-C (or set KEEP=1)")
	uiPort := flag.Int("ui-port", 8233, "Web UI port (0 picks a free one)")
	workerBin := flag.String("worker", "bin/worker", "worker binary to run")
	dups := flag.Int("duplicates", 5, "duplicate starts fired at each order")
	flag.Parse()
	if err := run(*keep, *uiPort, *workerBin, *dups); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type demoOrder struct {
	id, pm, note string
	amount       int64
	fault        *fakestripe.Fault
	started      []*workflows.Started
	stale        *workflows.Started
	result       orders.CheckoutResult
	err          error
}

func run(keep bool, uiPort int, workerBin string, dups int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if uiPort != 0 && !portFree(uiPort) {
		fmt.Printf("port %d is busy; the Web UI gets a free port instead\n", uiPort)
		uiPort = 0
	}

	fmt.Println("▸ starting the Temporal dev server (bin/temporal) with its Web UI")
	srv, err := devserver.Start(ctx, &devserver.Opts{UIPort: uiPort})
	if err != nil {
		return err
	}
	defer srv.Stop()

	fmt.Println("▸ preparing Postgres schema", demoSchema)
	dbURL, pool, err := prepareDB(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	metricsAddr := "127.0.0.1:9464"
	if !portFree(9464) {
		metricsAddr = fmt.Sprintf("127.0.0.1:%d", freePort())
	}
	env := []string{
		"DATABASE_URL=" + dbURL, "TEMPORAL_ADDRESS=" + srv.Address(), "TEMPORAL_NAMESPACE=default",
		"TEMPORAL_TASK_QUEUE=" + taskQueue, "METRICS_ADDR=" + metricsAddr,
	}
	var stripeFake *fakestripe.Server
	if os.Getenv("STRIPE_SECRET_KEY") != "" && os.Getenv("SENDGRID_API_KEY") != "" {
		fmt.Println("▸ using real Stripe (test mode) and SendGrid: their keys are set")
		env = append(env, "STRIPE_SECRET_KEY="+os.Getenv("STRIPE_SECRET_KEY"), "SENDGRID_API_KEY="+os.Getenv("SENDGRID_API_KEY"))
	} else {
		fmt.Println("▸ starting fake Stripe and SendGrid (set STRIPE_SECRET_KEY and SENDGRID_API_KEY to use the real ones)")
		stripeFake = fakestripe.New(nil)
		s := httptest.NewServer(stripeFake)
		defer s.Close()
		m := httptest.NewServer(fakesendgrid.New(nil))
		defer m.Close()
		env = append(env, "STRIPE_SECRET_KEY=sk_test_demo", "STRIPE_API_BASE="+s.URL,
			"SENDGRID_API_KEY=SG.demo", "SENDGRID_API_BASE="+m.URL)
	}
	if os.Getenv("RECEIPT_FROM") == "" {
		env = append(env, "RECEIPT_FROM=receipts@keyed.example")
	}

	fmt.Println("▸ starting the worker:", workerBin)
	logPath := filepath.Join(".demo", "worker.log")
	_ = os.MkdirAll(".demo", 0o755)
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	worker := exec.Command(workerBin)
	worker.Env = append(os.Environ(), env...)
	worker.Stdout, worker.Stderr = logFile, logFile
	worker.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := worker.Start(); err != nil {
		return fmt.Errorf("start worker (run `make demo`, which builds it): %w", err)
	}
	defer func() {
		_ = worker.Process.Signal(syscall.SIGTERM)
		_ = worker.Wait()
	}()

	tc, err := client.Dial(client.Options{HostPort: srv.Address(), Logger: sdklog.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))})
	if err != nil {
		return err
	}
	defer tc.Close()
	store, _ := orders.NewStore(pool)
	fx, _ := effects.NewClient(pool, &effects.ClientOpts{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})

	stamp := time.Now().Format("150405")
	list := []*demoOrder{
		{id: "A-" + stamp, pm: "pm_card_visa", amount: 1250, note: "happy path"},
		{id: "B-" + stamp, pm: "pm_card_visa", amount: 4999, note: "Stripe charges, response lost",
			fault: &fakestripe.Fault{Kind: fakestripe.FaultDropResponse, Times: 2, Match: "B-" + stamp}},
		{id: "C-" + stamp, pm: "pm_card_visa", amount: 300, note: "Stripe answers 500 first",
			fault: &fakestripe.Fault{Kind: fakestripe.FaultServerError, Times: 1, Match: "C-" + stamp}},
		{id: "D-" + stamp, pm: "pm_card_chargeDeclined", amount: 800, note: "card declined"},
	}
	fmt.Printf("▸ creating %d orders and firing %d concurrent starts at each\n", len(list), dups)
	for _, o := range list {
		if o.fault != nil && stripeFake != nil {
			stripeFake.Inject(*o.fault)
		}
		if _, _, err := store.Create(ctx, orders.NewOrder{TenantID: tenant, ID: o.id, AmountMinor: o.amount, Currency: "eur",
			CustomerEmail: "ada@example.com", PaymentMethod: o.pm}); err != nil {
			return err
		}
		ord, _ := store.Get(ctx, tenant, o.id)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := 0; i < dups; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := workflows.Start(ctx, tc, orders.NewCheckoutInput(tenant, o.id), &workflows.StartOpts{TaskQueue: taskQueue, Order: ord})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					o.err = err
					return
				}
				o.started = append(o.started, st)
			}()
		}
		wg.Wait()
		if o.err != nil {
			return fmt.Errorf("start %s: %w", o.id, o.err)
		}
	}
	fmt.Println("▸ waiting for the runs to finish")
	for _, o := range list {
		st := o.started[0]
		o.err = tc.GetWorkflow(ctx, st.WorkflowID, st.RunID).Get(ctx, &o.result)
	}
	fmt.Println("▸ firing a stale duplicate start at every finished order")
	for _, o := range list {
		st, err := workflows.Start(ctx, tc, orders.NewCheckoutInput(tenant, o.id), &workflows.StartOpts{TaskQueue: taskQueue})
		if err != nil {
			return fmt.Errorf("stale start %s: %w", o.id, err)
		}
		o.stale = st
		if st.Created {
			// Only a failed order may run again (a deliberate re-run); its
			// effect records replay the stored decline without calling Stripe.
			_ = tc.GetWorkflow(ctx, st.WorkflowID, st.RunID).Get(ctx, nil)
		}
	}

	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ORDER\tSCENARIO\tWORKFLOW ID\tSTARTS new/duplicates suppressed\tSTALE START\tCHARGE\tRECEIPT\tEFFECTS")
	for _, o := range list {
		newRuns := 0
		for _, st := range o.started {
			if st.Created {
				newRuns++
			}
		}
		charge, receipt := o.result.Charge.PaymentIntentID+" "+o.result.Charge.Status, o.result.Receipt.MessageID
		if o.err != nil {
			charge, receipt = "failed: "+shortErr(o.err), "not sent"
		}
		if stripeFake != nil {
			charge += fmt.Sprintf(" (stripe charges: %d)", stripeFake.ChargesForMetadata("order_id", o.id))
		}
		prefix, _ := orders.OrderKey(tenant, o.id)
		recs, _ := fx.List(ctx, prefix)
		var states []string
		for _, r := range recs {
			states = append(states, r.Kind+"="+string(r.State))
		}
		stale := "refused (order done)"
		if o.stale.Created {
			stale = "re-run after failure"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\n", o.id, o.note, o.started[0].WorkflowID, newRuns, len(o.started)-newRuns,
			stale, charge, receipt, strings.Join(states, " "))
	}
	tw.Flush()
	if stripeFake != nil {
		fmt.Printf("\nStripe saw %d create requests and made %d charges.\n", stripeFake.Requests(), stripeFake.Charges())
	}
	if n, err := scrapeSuppressed("http://" + metricsAddr + "/metrics"); err == nil {
		fmt.Printf("duplicates suppressed by effect records (worker metric keyed_effect_duplicates_suppressed_total): %s\n", n)
	}
	ui := srv.UIAddress()
	fmt.Printf("\nWeb UI: %s/namespaces/default/workflows?query=TenantID%%3D%%22%s%%22\n", ui, tenant)
	fmt.Printf("worker log: %s   metrics: http://%s/metrics\n", logPath, metricsAddr)
	if keep {
		fmt.Println("\nServers are up for exploring. Press Ctrl-C to stop everything.")
		<-ctx.Done()
	}
	return nil
}

func prepareDB(ctx context.Context) (string, *pgxpool.Pool, error) {
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		base = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", nil, fmt.Errorf("connect to Postgres (run `make postgres`): %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+demoSchema); err != nil {
		return "", nil, err
	}
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	url := base + sep + "search_path=" + demoSchema
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return "", nil, err
	}
	if _, err := migrations.Apply(ctx, pool); err != nil {
		pool.Close()
		return "", nil, err
	}
	return url, pool, nil
}

func scrapeSuppressed(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	var parts []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "keyed_effect_duplicates_suppressed_total{") {
			parts = append(parts, strings.TrimPrefix(line, "keyed_effect_duplicates_suppressed_total"))
		}
	}
	if len(parts) == 0 {
		return "0", nil
	}
	return strings.Join(parts, ", "), nil
}

func shortErr(err error) string {
	var s = err.Error()
	if i := strings.LastIndex(s, ": "); i > 0 && len(s) > 80 {
		s = s[i+2:]
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	l.Close()
	return !errors.Is(err, syscall.EADDRINUSE)
}
