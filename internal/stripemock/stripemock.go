// Package stripemock runs stripe-mock, Stripe's mock of its API that checks
// every request against Stripe's OpenAPI spec, for contract tests of the
// requests keyed and its Stripe fake send. It is test tooling: no binary
// imports it.
package stripemock

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keyedhq/keyed/internal/toolbin"
)

// Version is the stripe-mock that `make tools` builds into bin/.
const Version = "v0.203.0"

// EnvBin names a stripe-mock binary to run instead of bin/stripe-mock.
const EnvBin = "KEYED_STRIPE_MOCK_BIN"

// Start runs stripe-mock on free loopback ports until the test ends and
// returns its HTTP base URL. It fails the test, saying how to build the
// binary, when there is none, and with its output when it does not listen
// within 20 s.
func Start(t testing.TB) string {
	t.Helper()
	bin, err := findBinary()
	if err != nil {
		t.Fatalf("%v\nBuild it with `make tools`, or `GOBIN=$PWD/bin go install github.com/stripe/stripe-mock@%s` at the repository's root, "+
			"or point %s at a stripe-mock binary.", err, Version, EnvBin)
	}
	httpAddr, httpsAddr, err := freeAddrPair()
	if err != nil {
		t.Fatalf("stripe-mock: pick ports: %v", err)
	}
	cmd := exec.Command(bin, "-http-addr", httpAddr, "-https-addr", httpsAddr)
	out := &syncWriter{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		if err := cmd.Process.Kill(); err != nil {
			t.Logf("kill stripe-mock: %v", err)
		}
		_ = cmd.Wait() // Killed: its error only says so.
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", httpAddr, 200*time.Millisecond)
		if err == nil {
			if err := conn.Close(); err != nil {
				t.Logf("stripe-mock: close probe: %v", err)
			}
			return "http://" + httpAddr
		}
		if time.Now().After(deadline) {
			t.Fatalf("stripe-mock did not listen on %s within 20s; output:\n%s", httpAddr, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// findBinary returns EnvBin, or bin/stripe-mock beside the go.mod above the
// working directory.
func findBinary() (string, error) {
	if p := os.Getenv(EnvBin); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("stripe-mock not found at %s=%s: %w", EnvBin, p, err)
		}
		return p, nil
	}
	dir, err := toolbin.Dir()
	if err != nil {
		return "", fmt.Errorf("stripe-mock not found: %w", err)
	}
	p := filepath.Join(dir, "stripe-mock")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("stripe-mock not found at %s: %w", p, err)
	}
	return p, nil
}

// freeAddrPair returns two distinct free loopback addresses, holding both
// listeners until both are picked so that neither is handed out twice.
func freeAddrPair() (string, string, error) {
	var addrs [2]string
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", "", err
		}
		defer ln.Close()
		addrs[i] = "127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	return addrs[0], addrs[1], nil
}

// syncWriter collects the child's output for a failure message.
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
