package fxapp_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.uber.org/fx"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// proxyServerName is the only name in the proxy's certificate, so a client
// that does not send TEMPORAL_TLS_SERVER_NAME fails to verify it.
const proxyServerName = "temporal.keyed.test"

// pki is a test certificate authority with a server and a client
// certificate, written as PEM files.
type pki struct {
	dir                       string
	CA, ClientCert, ClientKey string // file paths
	server                    tls.Certificate
	pool                      *x509.CertPool
	caCert                    *x509.Certificate
	caKey                     *ecdsa.PrivateKey
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir(), pool: x509.NewCertPool()}
	p.caKey = newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	require.NoError(t, err)
	p.caCert, err = x509.ParseCertificate(der)
	require.NoError(t, err)
	p.pool.AddCert(p.caCert)
	p.CA = p.write(t, "ca.crt", "CERTIFICATE", der)

	serverKey := newKey(t)
	serverDER := p.issue(t, serverKey, proxyServerName, x509.ExtKeyUsageServerAuth, []string{proxyServerName})
	p.server = tls.Certificate{Certificate: [][]byte{serverDER}, PrivateKey: serverKey}

	clientKey := newKey(t)
	p.ClientCert = p.write(t, "client.crt", "CERTIFICATE", p.issue(t, clientKey, "keyed-worker", x509.ExtKeyUsageClientAuth, nil))
	keyDER, err := x509.MarshalPKCS8PrivateKey(clientKey)
	require.NoError(t, err)
	p.ClientKey = p.write(t, "client.key", "PRIVATE KEY", keyDER)
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k
}

var serial atomic.Int64

func (p *pki) issue(t *testing.T, key *ecdsa.PrivateKey, cn string, usage x509.ExtKeyUsage, dns []string) []byte {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(100 + serial.Add(1)), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	require.NoError(t, err)
	return der
}

func (p *pki) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
	return path
}

// tlsProxy terminates TLS, requiring a client certificate issued by its
// CA, and forwards the bytes to a plain gRPC port.
type tlsProxy struct {
	ln       net.Listener
	verified atomic.Int64 // connections whose client certificate was verified
	refused  atomic.Int64 // handshakes that failed
}

func startTLSProxy(t *testing.T, p *pki, upstream string) *tlsProxy {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{p.server},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.pool,
		NextProtos:   []string{"h2"}, // gRPC insists on ALPN
		MinVersion:   tls.VersionTLS12,
	})
	require.NoError(t, err)
	px := &tlsProxy{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { px.serve(c.(*tls.Conn), upstream) })
		}
	})
	return px
}

func (px *tlsProxy) Addr() string { return px.ln.Addr().String() }

func (px *tlsProxy) serve(c *tls.Conn, upstream string) {
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		px.refused.Add(1)
		// Linger as a server does, so that the client reads the alert
		// (TLS 1.3's "certificate required" comes after its handshake)
		// rather than a reset.
		_ = c.NetConn().SetReadDeadline(time.Now().Add(2 * time.Second))
		_, _ = io.Copy(io.Discard, c.NetConn())
		return
	}
	px.verified.Add(1)
	up, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done // either side closing ends both
}

// tlsEnv is the worker environment of d reaching Temporal through px with
// the client certificate of p.
func tlsEnv(d *fxapptest.Deps, px *tlsProxy, p *pki) map[string]string {
	env := map[string]string{}
	for k, v := range d.Env {
		env[k] = v
	}
	env["TEMPORAL_ADDRESS"] = px.Addr()
	env["TEMPORAL_TLS_SERVER_CA_CERT_PATH"] = p.CA
	env["TEMPORAL_TLS_SERVER_NAME"] = proxyServerName
	env["TEMPORAL_TLS_CLIENT_CERT_PATH"] = p.ClientCert
	env["TEMPORAL_TLS_CLIENT_KEY_PATH"] = p.ClientKey
	return env
}

// TestTemporalOverMutualTLS runs the worker and the starter against the dev
// server through a TLS-terminating proxy that requires a client
// certificate: the worker runs an order and the starter sees it; a wrong CA
// and a missing client certificate fail the start quickly and clearly.
func TestTemporalOverMutualTLS(t *testing.T) {
	t.Parallel()
	srv := fxapptest.StartServer(t)
	p := newPKI(t, "keyed test CA")
	px := startTLSProxy(t, p, srv.Address())

	d := fxapptest.Prepare(t, &fxapptest.Opts{Server: srv})
	d.Env = tlsEnv(d, px, p)
	w, err := fxapptest.StartOn(t, d, nil)
	require.NoError(t, err, "the worker starts over mTLS")
	require.Equal(t, "mtls", w.Config.Temporal.TLS())
	require.Contains(t, w.Config.String(), "temporal_tls=mtls")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	order, _, err := w.Orders.Create(ctx, orders.NewOrder{
		TenantID: "acme", ID: "tls-1", AmountMinor: 4200, Currency: "usd",
		CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa",
	})
	require.NoError(t, err)
	in := orders.NewOrderInput("acme", "tls-1")
	st, err := orderflow.Start(ctx, w.Client, in, &orderflow.StartOpts{TaskQueue: w.Config.Temporal.TaskQueue, Order: order})
	require.NoError(t, err)
	var res orders.OrderResult
	require.NoError(t, w.Client.GetWorkflow(ctx, st.WorkflowID, st.RunID).Get(ctx, &res))
	require.Equal(t, 1, w.Stripe.Charges(), "one charge")
	require.Len(t, w.SendGrid.Messages(), 1, "one receipt")
	require.Positive(t, px.verified.Load(), "the traffic went through the proxy")

	// The starter app connects with the same settings and sees the run.
	cfg := loadConfig(t, config.Starter, d.Env)
	var tc client.Client
	app := fx.New(fxapp.Starter(cfg, quiet(), fx.Populate(&tc)))
	require.NoError(t, app.Start(ctx))
	defer func() { require.NoError(t, app.Stop(context.Background())) }()
	_, err = tc.CheckHealth(ctx, &client.CheckHealthRequest{})
	require.NoError(t, err)
	desc, err := tc.DescribeWorkflow(ctx, st.WorkflowID, st.RunID)
	require.NoError(t, err)
	require.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.RawResponse.GetWorkflowExecutionInfo().GetStatus())

	t.Run("WrongCA", func(t *testing.T) {
		t.Parallel()
		other := newPKI(t, "some other CA")
		d := fxapptest.Prepare(t, &fxapptest.Opts{Server: srv})
		d.Env = tlsEnv(d, px, p)
		d.Env["TEMPORAL_TLS_SERVER_CA_CERT_PATH"] = other.CA
		err := startFails(t, d)
		require.ErrorContains(t, err, "certificate signed by unknown authority")
	})
	t.Run("SilentFrontend", func(t *testing.T) {
		t.Parallel()
		// A frontend that accepts connections and never answers the
		// handshake: the SDK's 5 s bound on its first call ends the wait.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { _ = c.Close() })
			}
		}()
		d := fxapptest.Prepare(t, &fxapptest.Opts{Server: srv})
		d.Env = tlsEnv(d, px, p)
		d.Env["TEMPORAL_ADDRESS"] = ln.Addr().String()
		began := time.Now()
		_, err = fxapptest.StartOn(t, d, nil)
		t.Logf("failed after %s: %v", time.Since(began).Round(time.Millisecond), err)
		require.ErrorContains(t, err, "cannot reach Temporal at "+ln.Addr().String())
		require.Less(t, time.Since(began), 20*time.Second, "not the minute-long start timeout")
	})
	t.Run("NoClientCertificate", func(t *testing.T) {
		t.Parallel()
		d := fxapptest.Prepare(t, &fxapptest.Opts{Server: srv})
		d.Env = tlsEnv(d, px, p)
		delete(d.Env, "TEMPORAL_TLS_CLIENT_CERT_PATH")
		delete(d.Env, "TEMPORAL_TLS_CLIENT_KEY_PATH")
		err := startFails(t, d)
		require.ErrorContains(t, err, "certificate required")
	})
}

// startFails starts the worker app on d, expects it to fail within 20
// seconds (not the minute-long start timeout), and returns the error.
func startFails(t *testing.T, d *fxapptest.Deps) error {
	t.Helper()
	began := time.Now()
	_, err := fxapptest.StartOn(t, d, nil)
	took := time.Since(began)
	require.Error(t, err)
	t.Logf("failed after %s: %v", took.Round(time.Millisecond), err)
	require.Less(t, took, 20*time.Second, "a bad TLS setting fails fast")
	require.ErrorContains(t, err, "cannot reach Temporal at ")
	require.False(t, errors.Is(err, context.DeadlineExceeded), "the cause, not a timeout: %v", err)
	return err
}

// TestTemporalAPIKey connects the Temporal client to a TLS gRPC server that
// answers health checks only with the right `authorization: Bearer <key>`
// header, the way Temporal Cloud checks an API key.
func TestTemporalAPIKey(t *testing.T) {
	t.Parallel()
	const key = "tmprl-test-key"
	p := newPKI(t, "keyed test CA")
	addr := startKeyServer(t, p, key)

	connect := func(apiKey string) error {
		cfg := loadConfig(t, config.Starter, map[string]string{
			"TEMPORAL_ADDRESS":                 addr,
			"TEMPORAL_API_KEY":                 apiKey,
			"TEMPORAL_TLS_SERVER_CA_CERT_PATH": p.CA,
			"TEMPORAL_TLS_SERVER_NAME":         proxyServerName,
		})
		require.Equal(t, "tls", cfg.Temporal.TLS())
		var tc client.Client
		app := fx.New(fx.NopLogger, fx.Supply(cfg.Temporal, quiet()), fxapp.TemporalModule, fx.Populate(&tc))
		require.NoError(t, app.Err())
		defer func() { require.NoError(t, app.Stop(context.Background())) }()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := tc.CheckHealth(ctx, &client.CheckHealthRequest{})
		return err
	}
	require.NoError(t, connect(key), "the key reaches the server")
	err := connect("wrong-key")
	require.Equal(t, codes.Unauthenticated, status.Code(errors.Unwrap(err)), "%v", err)
}

// startKeyServer serves GetSystemInfo and gRPC health over TLS on a free
// port, refusing any call without the header "authorization: Bearer key".
func startKeyServer(t *testing.T, p *pki, key string) string {
	t.Helper()
	check := func(ctx context.Context) error {
		md, _ := metadata.FromIncomingContext(ctx)
		if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+key {
			return status.Error(codes.Unauthenticated, "bad API key")
		}
		return nil
	}
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewServerTLSFromCert(&p.server)),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := check(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
	)
	hs := health.NewServer()
	hs.SetServingStatus("temporal.api.workflowservice.v1.WorkflowService", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	workflowservice.RegisterWorkflowServiceServer(srv, systemInfoOnly{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

type systemInfoOnly struct {
	workflowservice.UnimplementedWorkflowServiceServer
}

func (systemInfoOnly) GetSystemInfo(context.Context, *workflowservice.GetSystemInfoRequest) (*workflowservice.GetSystemInfoResponse, error) {
	return &workflowservice.GetSystemInfoResponse{}, nil
}
