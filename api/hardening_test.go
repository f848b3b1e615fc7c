package api_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
)

// requireUnavailable checks a 503 unavailable with Retry-After.
func requireUnavailable(t *testing.T, r response, what string) {
	t.Helper()
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s: %s", what, r.body)
	require.Equal(t, api.CodeUnavailable, decodeError(t, r).Code, what)
	require.Equal(t, "1", r.header.Get("Retry-After"), what)
}

// With the database stalled (a proxy that stops forwarding), every route
// answers 503 unavailable with Retry-After within the request timeout plus
// the release's bound, instead of hanging until the client gives up; once
// the database answers again, the same Idempotency-Key creates the order.
func TestStalledDatabaseAnswers503WithinSeconds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{proxied: true, handler: &api.HandlerOpts{RequestTimeout: time.Second}})
	b.created(t, b.keyA, "k-before", orderBody("ord_before", 100))

	b.proxy.set(proxyStall)
	c := &http.Client{Timeout: 10 * time.Second} // without a server-side bound, the request fails here
	for _, tc := range []struct{ name, method, path, idemKey, body string }{
		{"GET an order", "GET", "/v1/orders/ord_before", "", ""},
		{"POST a new order (the claim stalls)", "POST", "/v1/orders", "k-stalled", orderBody("ord_stalled", 200)},
		{"POST a replay (the claim stalls)", "POST", "/v1/orders", "k-before", orderBody("ord_before", 100)},
	} {
		start := time.Now()
		r := doAt(t, c, b.srv.URL, tc.method, tc.path, b.keyA, tc.idemKey, tc.body)
		took := time.Since(start)
		requireUnavailable(t, r, tc.name)
		t.Logf("%s: 503 after %s", tc.name, took.Round(time.Millisecond))
		// A bound, not a speed: 1 s request timeout + 1 s release, with slack.
		require.Less(t, took, 5*time.Second, "%s took %s", tc.name, took)
		require.NotContains(t, string(r.body), "127.0.0.1", tc.name)
	}
	requireUnavailable(t, doAt(t, c, b.srv.URL, "GET", "/healthz", "", "", ""), "healthz")

	b.proxy.set(proxyForward)
	require.Eventually(t, func() bool {
		return b.do(t, "GET", "/healthz", "", "", "").status == http.StatusOK
	}, 10*time.Second, 50*time.Millisecond)
	b.created(t, b.keyA, "k-stalled", orderBody("ord_stalled", 200))
}

// With the database down (connections closed and refused), every route
// answers 503 unavailable, as api/README.md says, not 500 internal.
func TestDatabaseDownAnswers503(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{proxied: true, handler: &api.HandlerOpts{RequestTimeout: 2 * time.Second}})
	b.created(t, b.keyA, "k-up", orderBody("ord_up", 100))

	b.proxy.set(proxyDown)
	requireUnavailable(t, b.do(t, "GET", "/v1/orders/ord_up", b.keyA, "", ""), "GET")
	requireUnavailable(t, b.do(t, "POST", "/v1/orders", b.keyA, "k-down", orderBody("ord_down", 100)), "POST")
	requireUnavailable(t, b.do(t, "POST", "/v1/orders", b.keyA, "k-up", orderBody("ord_up", 100)), "POST replay")

	b.proxy.set(proxyForward)
	b.created(t, b.keyA, "k-down", orderBody("ord_down", 100))
}

// A request that runs out of time after claiming its Idempotency-Key
// releases the key on a fresh context (its own has expired), so the retry
// the 503 invites runs at once instead of getting 409 for the lease.
func TestRetryAfterA503IsNotRefusedWhileTheKeyIsLeased(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{handler: &api.HandlerOpts{RequestTimeout: 500 * time.Millisecond}})
	release := b.holdOrder(t, b.tenantA, "ord_held")
	r := b.do(t, "POST", "/v1/orders", b.keyA, "k-held", orderBody("ord_held", 300))
	requireUnavailable(t, r, "POST blocked past its timeout")
	require.Equal(t, 0, b.rows(t)["api_requests"], "the claim was not released")

	release()
	b.created(t, b.keyA, "k-held", orderBody("ord_held", 300)) // a 409 fails it
}

// GET shows stable codes and plain messages, never the stored start error
// (it names the Temporal address) or an effect's stored message (an
// operator's resolve reason, a provider's text).
func TestGetShowsCodesNotInternalDetail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do(t, "POST", "/v1/orders", b.keyA, "k-detail", orderBody("ord_detail", 100))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	_, err := b.pool.Exec(b.ctx, `UPDATE keyed_outbox SET attempts = 3,
		last_error = 'start workflow: dial tcp 127.0.0.1:1: connect: connection refused'`)
	require.NoError(t, err)
	prefix := b.tenantA + ":order:ord_detail:"
	_, err = b.pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, error_code, error_message, finished_at) VALUES
		($1 || 'charge', $2, 'charge', 'failed_transient', 'w1', 'resolved_retry', 'resolved by operator: ticket OPS-7731, bob checked the Stripe dashboard', now()),
		($1 || 'receipt', $2, 'receipt', 'failed_terminal', 'w1', 'Weird Code: 10.0.0.7', 'sendgrid: 10.0.0.7:443 said no', now()),
		($1 || 'mark_paid', $2, 'mark_paid', 'succeeded', 'w1', NULL, 'resolved by operator: done by hand, see OPS-7732', now())`,
		prefix, b.tenantA)
	require.NoError(t, err)

	r = b.do(t, "GET", "/v1/orders/ord_detail", b.keyA, "", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	for _, secret := range []string{"127.0.0.1", "dial tcp", "connection refused", "OPS-77", "bob", "operator:", "10.0.0.7", "sendgrid", "Weird"} {
		require.NotContains(t, string(r.body), secret)
	}
	var detail api.OrderDetail
	require.NoError(t, json.Unmarshal(r.body, &detail))
	require.Equal(t, api.StartFailed, detail.Start.LastErrorCode)
	require.NotEmpty(t, detail.Start.LastError)
	codes := map[string]string{}
	for _, e := range detail.Effects {
		codes[e.Kind] = e.ErrorCode
		if e.ErrorCode != "" {
			require.NotEmpty(t, e.Error, e.Kind)
		}
	}
	require.Equal(t, map[string]string{"charge": api.EffectResolvedRetry, "receipt": api.EffectUnclassified, "mark_paid": ""}, codes)
}

// rawHTTP sends raw bytes to addr, waits, and returns the response.
func rawHTTP(t *testing.T, addr, request string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(conn, request)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

// A body slower than the server's read timeout gets 408 request_timeout
// as JSON, without the socket addresses of the read error. What net/http
// answers itself, before any handler runs, stays plain text (documented in
// api/README.md).
func TestSlowBodyGets408WithoutAddresses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv, err := api.NewServer("127.0.0.1:0", b.handler, &api.ServerOpts{ReadTimeout: 500 * time.Millisecond, PruneInterval: -1, Logger: b.logger})
	require.NoError(t, err)
	require.NoError(t, srv.Start(b.ctx))
	t.Cleanup(func() { _ = srv.Stop(b.ctx) })

	resp, body := rawHTTP(t, srv.Addr(), "POST /v1/orders HTTP/1.1\r\nHost: keyed\r\nAuthorization: Bearer "+b.keyA+
		"\r\nIdempotency-Key: k-slow-body\r\nContent-Length: 200\r\n\r\n{\"order_id\":")
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, body)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Contains(t, body, `"code":"request_timeout"`)
	require.NotContains(t, body, "127.0.0.1")
	require.NotContains(t, body, "tcp")
	require.Equal(t, 0, b.rows(t)["api_requests"])

	// net/http's own answer to a malformed request line.
	resp, body = rawHTTP(t, srv.Addr(), "NOT A REQUEST\r\n\r\n")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain"), resp.Header.Get("Content-Type"))
}

// A handler panic answers 500 internal as JSON instead of a dropped
// connection.
func TestPanicAnswersJSON500(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.handler.HandleForTest("GET /panic", func(http.ResponseWriter, *http.Request) { panic("boom at 10.0.0.7") })
	r := b.do(t, "GET", "/panic", "", "", "")
	require.Equal(t, http.StatusInternalServerError, r.status, "%s", r.body)
	require.Equal(t, api.CodeInternal, decodeError(t, r).Code)
	require.NotContains(t, string(r.body), "boom")
}

// The server holds at most MaxConns connections, so that callers cannot
// take the file descriptors its database pool needs: at the cap a new
// caller closes the connection idle longest between requests, and with
// none idle it waits until one ends (here a silent one, at the header
// timeout) instead of being accepted.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const maxConns = 4
	srv, err := api.NewServer("127.0.0.1:0", b.handler, &api.ServerOpts{MaxConns: maxConns,
		ReadHeaderTimeout: 30 * time.Second, PruneInterval: -1, Logger: b.logger})
	require.NoError(t, err)
	require.NoError(t, srv.Start(b.ctx))
	t.Cleanup(func() { _ = srv.Stop(b.ctx) })

	// maxConns callers keep their connections open, idle, after a request.
	var kept []net.Conn
	for range maxConns {
		c, r := keepAliveRequest(t, srv.Addr())
		require.Equal(t, http.StatusOK, r.StatusCode)
		kept = append(kept, c)
	}
	require.Equal(t, maxConns, srv.OpenConnsForTest())
	// One more caller is served, and an idle connection was closed for it.
	c, r := keepAliveRequest(t, srv.Addr())
	require.Equal(t, http.StatusOK, r.StatusCode)
	kept = append(kept, c)
	require.LessOrEqual(t, srv.OpenConnsForTest(), maxConns)
	closed := 0
	for _, c := range kept[:maxConns] {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
			closed++
		}
	}
	require.Equal(t, 1, closed, "one idle connection is closed for the new caller")
	open, capped, closedIdle, closedSlow := b.metrics.ConnMetricsForTest()
	require.EqualValues(t, maxConns, testutil.ToFloat64(capped))
	require.EqualValues(t, 1, testutil.ToFloat64(closedIdle))
	require.EqualValues(t, srv.OpenConnsForTest(), testutil.ToFloat64(open))
	for _, c := range kept {
		require.NoError(t, c.Close())
	}

	// Silent connections and ones sending their headers a byte at a time
	// fill every slot; a caller after them closes the oldest once its
	// grace is over, long before the header timeout, never past the cap.
	require.Eventually(t, func() bool { return srv.OpenConnsForTest() == 0 }, 5*time.Second, 10*time.Millisecond)
	slow := func(partial string) {
		c, err := net.Dial("tcp", srv.Addr())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		_, err = io.WriteString(c, partial)
		require.NoError(t, err)
	}
	for i := range maxConns {
		slow([]string{"", "GET /healthz HTTP/1.1\r\n"}[i%2])
	}
	for i := range 2 {
		// The first caller closes a silent connection, the second (after
		// another silent one takes the first caller's place) one that sent
		// part of its headers.
		if i > 0 {
			slow("")
		}
		require.Eventually(t, func() bool { return srv.OpenConnsForTest() == maxConns }, 5*time.Second, 10*time.Millisecond)
		start := time.Now()
		c, r = keepAliveRequest(t, srv.Addr())
		require.Equal(t, http.StatusOK, r.StatusCode)
		require.Less(t, time.Since(start), 10*time.Second, "served before the header timeout")
		require.LessOrEqual(t, srv.OpenConnsForTest(), maxConns)
		require.EqualValues(t, i+1, testutil.ToFloat64(closedSlow), "a slow new connection was closed for the caller")
		require.NoError(t, c.Close())
		require.Eventually(t, func() bool { return srv.OpenConnsForTest() == maxConns-1 }, 5*time.Second, 10*time.Millisecond)
	}
	require.EqualValues(t, 1, testutil.ToFloat64(closedIdle))
}

// keepAliveRequest sends GET /healthz on a new connection and returns the
// connection, left open, with the response read.
func keepAliveRequest(t *testing.T, addr string) (net.Conn, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: keyed\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return conn, resp
}

// Headers over api.MaxHeaderBytes get net/http's 431, so that no
// connection makes the server buffer more.
func TestHugeHeadersGet431(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv, err := api.NewServer("127.0.0.1:0", b.handler, &api.ServerOpts{PruneInterval: -1, Logger: b.logger})
	require.NoError(t, err)
	require.NoError(t, srv.Start(b.ctx))
	t.Cleanup(func() { _ = srv.Stop(b.ctx) })
	pad := strings.Repeat("a", api.MaxHeaderBytes+8<<10)
	// Only the status line: the server closes with the rest of the request
	// unread, which resets the connection under the body.
	conn, err := net.Dial("tcp", srv.Addr())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: keyed\r\nX-Pad: "+pad+"\r\n\r\n")
	require.NoError(t, err)
	status, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 431 Request Header Fields Too Large\r\n", status)
	resp, body := rawHTTP(t, srv.Addr(), "GET /healthz HTTP/1.1\r\nHost: keyed\r\nX-Pad: "+pad[:api.MaxHeaderBytes/2]+"\r\n\r\n")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
}
