package api_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/outbox/temporalstart"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

// devServer is the dev server the package's tests share; they keep apart
// by tenant and task queue.
var (
	devServer    *devserver.Server
	temporalAddr string
)

// childEnv makes the test binary serve the API instead of running tests, so
// that a test can kill a real process mid-request. See startChild.
const childEnv = "KEYED_API_TEST_CHILD_DB"

// The child's Temporal address, namespace and task queue, for Prefer: wait.
const (
	childTemporalEnv  = "KEYED_API_TEST_CHILD_TEMPORAL"
	childNamespaceEnv = "KEYED_API_TEST_CHILD_NAMESPACE"
	childTaskQueueEnv = "KEYED_API_TEST_CHILD_TASK_QUEUE"
)

func TestMain(m *testing.M) {
	if url := os.Getenv(childEnv); url != "" {
		runChild(url)
		return
	}
	os.Exit(devserver.RunTests(m, "api", func(s *devserver.Server) { devServer, temporalAddr = s, s.Address() }))
}

// runChild serves the API on a free port over the database at url, prints
// "ADDR host:port", and serves until killed.
func runChild(url string) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	keys, err := api.KeysFrom(os.Getenv(api.EnvKeys), os.Getenv(api.EnvKeysFile))
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	// A request's database work may take up to 4 s on a loaded machine (an
	// ordinary request must not turn into a 503); a killed request's key is
	// taken over 5 s after its claim.
	opts := &api.HandlerOpts{RequestTimeout: 4 * time.Second, RequestLease: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if addr := os.Getenv(childTemporalEnv); addr != "" {
		// Prefer: wait, with the relay's starts on the given task queue.
		c, err := client.NewLazyClient(client.Options{HostPort: addr, Namespace: os.Getenv(childNamespaceEnv), Logger: quietLogger{}})
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		opts.Starter = temporalstart.New(c, &temporalstart.Opts{TaskQueue: os.Getenv(childTaskQueueEnv),
			Configure: pipeline.Configure(workflows.Pipelines(), pool)})
		// The lease must exceed MaxWait plus twice the request timeout.
		opts.MaxWait, opts.RequestTimeout, opts.RequestLease = 2*time.Second, time.Second, 5*time.Second
	}
	h, err := api.NewHandler(pool, keys, opts)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	srv, err := api.NewServer("127.0.0.1:0", h, nil)
	if err == nil {
		err = srv.Start(ctx)
	}
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("ADDR", srv.Addr())
	select {}
}

// child is the API served by another process.
type child struct {
	cmd  *exec.Cmd
	addr string
}

// startChild runs the test binary as an API server over the bundle's
// schema and keys.
func (b *bundle) startChild(t *testing.T) *child {
	t.Helper()
	return startChildOn(t, b.url, b.keyList)
}

// startChildOn runs the test binary as an API server over the database at
// url with the keys keyList and the extra environment env.
func startChildOn(t *testing.T, url, keyList string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+url, api.EnvKeys+"="+keyList, api.EnvKeysFile+"="), env...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "child API server did not report its address")
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ADDR ")
	require.True(t, ok, "child API server: %s", line)
	return &child{cmd: cmd, addr: addr}
}

type bundle struct {
	ctx       context.Context
	url       string
	pool      *pgxpool.Pool
	handler   *api.Handler
	srv       *httptest.Server
	reg       *prometheus.Registry
	metrics   *api.Metrics
	temporal  client.Client
	taskQueue string
	starter   *countingStarter
	logger    *slog.Logger
	proxy     *dbProxy // between the handler and Postgres, with setupOpts.proxied

	// Two tenants with one key each.
	tenantA, tenantB string
	keyA, keyB       string
	keyList          string
}

type setupOpts struct {
	handler *api.HandlerOpts
	// proxied puts a dbProxy (bundle.proxy) between the handler's pool and
	// Postgres; bundle.pool still connects directly.
	proxied bool
	// maxConns, if set, gives the handler a pool of its own of that size;
	// bundle.pool stays apart for the test's own queries.
	maxConns int32
	// unpartitioned keeps keyed_effects unpartitioned (an install not yet
	// converted), where API records are pruned by DELETE.
	unpartitioned bool
}

func setup(t testing.TB, opts ...setupOpts) *bundle {
	t.Helper()
	schema, url := effectstest.NewSchema(t)
	_ = schema
	pool := dbtest.Connect(t, url, &effectstest.PoolOpts{MaxConns: 32, Unpartitioned: len(opts) > 0 && opts[0].unpartitioned})
	b := &bundle{
		ctx:       context.Background(),
		url:       url,
		pool:      pool,
		reg:       prometheus.NewRegistry(),
		taskQueue: "api-test-" + randomID(4),
		tenantA:   "a" + randomID(4),
		tenantB:   "b" + randomID(4),
		keyA:      "sk_test_" + randomID(12),
		keyB:      "sk_test_" + randomID(12),
		logger:    slog.New(slog.DiscardHandler),
	}
	b.keyList = b.tenantA + "=" + b.keyA + "," + b.tenantB + "=" + b.keyB
	keys, err := api.ParseKeys(b.keyList)
	require.NoError(t, err)
	metrics, err := api.NewMetrics(b.reg)
	require.NoError(t, err)
	b.metrics = metrics
	hopts := &api.HandlerOpts{}
	if len(opts) > 0 && opts[0].handler != nil {
		hopts = opts[0].handler
	}
	hopts.Metrics, hopts.Logger, hopts.Gatherer = metrics, b.logger, b.reg
	var db api.DB = pool
	if len(opts) > 0 && opts[0].maxConns > 0 {
		db = dbtest.Connect(t, url, &effectstest.PoolOpts{MaxConns: opts[0].maxConns})
	}
	if len(opts) > 0 && opts[0].proxied {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		b.proxy = newDBProxy(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
		host, port, err := net.SplitHostPort(b.proxy.addr())
		require.NoError(t, err)
		proxied := url + "&host=" + host + "&port=" + port
		if !strings.Contains(url, "?") {
			proxied = url + "?host=" + host + "&port=" + port
		}
		db = dbtest.Connect(t, proxied, &effectstest.PoolOpts{MaxConns: 8})
	}
	b.handler, err = api.NewHandler(db, keys, hopts)
	require.NoError(t, err)
	b.srv = httptest.NewServer(b.handler)
	t.Cleanup(b.srv.Close)
	b.srv.Client().Transport.(*http.Transport).MaxIdleConnsPerHost = 64

	c, err := client.Dial(client.Options{HostPort: temporalAddr, Logger: quietLogger{}})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	b.temporal = c
	// The worker relay's own starter, on a task queue no worker polls: the
	// run exists in Temporal, which is what these tests count, and nothing
	// executes it.
	b.starter = &countingStarter{next: pipeline.Starter(c, nil, b.taskQueue, workflows.Pipelines()), calls: map[string]int{}}
	return b
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request to the bundle's server. An empty apiKey or idemKey
// leaves the header out.
func (b *bundle) do(t testing.TB, method, path, apiKey, idemKey, body string) response {
	t.Helper()
	return doAt(t, b.srv.Client(), b.srv.URL, method, path, apiKey, idemKey, body)
}

// created POSTs an order and requires 201 Created, sending it again after
// a 503 as a client would (the 503 gave its Idempotency-Key back), for up
// to 10 s: for the requests a test does not measure, on a handler whose
// request timeout the test keeps short, which a loaded machine can reach.
func (b *bundle) created(t testing.TB, apiKey, idemKey, body string) {
	t.Helper()
	var r response
	for deadline := time.Now().Add(10 * time.Second); ; {
		r = b.do(t, "POST", "/v1/orders", apiKey, idemKey, body)
		if r.status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
	}
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
}

func doAt(t testing.TB, c *http.Client, base, method, path, apiKey, idemKey, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	require.NoError(t, err)
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if idemKey != "" {
		req.Header.Set(api.HeaderIdempotencyKey, idemKey)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: got}
}

func orderBody(id string, amount int64) string {
	return fmt.Sprintf(`{"order_id":%q,"amount_minor":%d,"currency":"usd","customer_email":"ada@example.com","payment_method":"pm_card_visa"}`, id, amount)
}

func (b *bundle) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

// rows counts the rows an API request may write: in orders and
// keyed_outbox, and in keyed_effects its Idempotency-Key record
// ("api_requests") apart from every other effect ("effects").
func (b *bundle) rows(t testing.TB) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"orders", "keyed_outbox"} {
		out[table] = b.count(t, "SELECT count(*) FROM "+table)
	}
	out["api_requests"] = b.count(t, "SELECT count(*) FROM keyed_effects WHERE kind = $1", api.KindAPIRequest)
	out["effects"] = b.count(t, "SELECT count(*) FROM keyed_effects WHERE kind <> $1", api.KindAPIRequest)
	return out
}

// requestKey is the effect key of tenant's Idempotency-Key idem.
func requestKey(t testing.TB, tenant, idem string) string {
	t.Helper()
	k, err := api.RequestKeyForTest(tenant, idem)
	require.NoError(t, err)
	return k.String()
}

func (b *bundle) relay(t testing.TB, opts *outbox.RelayOpts) *outbox.Relay {
	t.Helper()
	if opts == nil {
		opts = &outbox.RelayOpts{}
	}
	opts.Logger = b.logger
	r, err := outbox.NewRelay(b.pool, b.starter, opts)
	require.NoError(t, err)
	return r
}

// countingStarter counts start calls per workflow ID.
type countingStarter struct {
	next  outbox.Starter
	mu    sync.Mutex
	calls map[string]int
}

func (s *countingStarter) Start(ctx context.Context, req outbox.Request) (*outbox.Started, error) {
	s.mu.Lock()
	s.calls[req.WorkflowID]++
	s.mu.Unlock()
	return s.next.Start(ctx, req)
}

func (s *countingStarter) count(workflowID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[workflowID]
}

func (s *countingStarter) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		n += c
	}
	return n
}

// workflowExists reports whether Temporal has a run for the workflow ID.
func (b *bundle) workflowExists(t testing.TB, workflowID string) bool {
	t.Helper()
	_, err := b.temporal.DescribeWorkflow(b.ctx, workflowID, "")
	var notFound *serviceerror.NotFound
	if errors.As(err, &notFound) {
		return false
	}
	require.NoError(t, err)
	return true
}

// randomID returns 2n random lowercase letters and digits (n at most 13).
func randomID(n int) string {
	return strings.ToLower(rand.Text())[:2*n]
}

type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}

// retryStorm sends one request 20 times as a well-behaved client retrying
// it would, the first eight at once: a 409 request_in_progress is resent,
// after a pause shorter than its Retry-After, under the same key and body.
// It requires the 20 answers to have status want and byte-identical bodies,
// and returns that body, how many answers were replays and how many 409s
// came along the way.
func retryStorm(t *testing.T, want int, send func() response) (body []byte, replays, conflicts int) {
	t.Helper()
	var mu sync.Mutex
	var oks []response
	one := func() {
		for {
			r := send()
			if r.status == http.StatusConflict {
				require.Equal(t, api.CodeRequestInProgress, decodeError(t, r).Code)
				require.Equal(t, strconv.Itoa(api.RetryAfterSeconds), r.header.Get("Retry-After"))
				mu.Lock()
				conflicts++
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				continue
			}
			mu.Lock()
			oks = append(oks, r)
			mu.Unlock()
			return
		}
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); one() }()
	}
	wg.Wait()
	for range 12 {
		one()
	}
	require.Len(t, oks, 20)
	for _, r := range oks {
		require.Equal(t, want, r.status, "%s", r.body)
		require.Equal(t, string(oks[0].body), string(r.body), "every answer is byte-identical")
		if r.header.Get(api.HeaderReplayed) == "true" {
			replays++
		}
	}
	return oks[0].body, replays, conflicts
}
