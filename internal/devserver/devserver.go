// Package devserver runs a real Temporal dev server (the Temporal CLI's
// `server start-dev`, with the Web UI embedded) as a child process, for the
// tests and for make demo. It never downloads anything: the binary comes
// from `make tools`, which builds it into bin/.
package devserver

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/internal/toolbin"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

// SearchAttributes returns what every dev server this package starts
// registers, as "Name=Type": every pipeline's search attributes
// (pipeline.SearchAttributes).
func SearchAttributes() []string {
	var out []string
	for _, sa := range pipeline.SearchAttributes(workflows.Pipelines()) {
		out = append(out, sa.Name+"="+sa.Type)
	}
	return out
}

// ErrNoBinary means the Temporal CLI binary was not found.
var ErrNoBinary = errors.New("temporal CLI not found: run `make tools` (it builds bin/temporal), or set KEYED_TEMPORAL_BIN")

// FindBinary returns $KEYED_TEMPORAL_BIN if set, else bin/temporal in the
// nearest directory above the working directory that holds go.mod. It
// returns an error wrapping ErrNoBinary if the file does not exist.
func FindBinary() (string, error) {
	if p := os.Getenv("KEYED_TEMPORAL_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w (KEYED_TEMPORAL_BIN=%s: %v)", ErrNoBinary, p, err)
		}
		return p, nil
	}
	dir, err := toolbin.Dir()
	if err != nil {
		return "", fmt.Errorf("%w (%v)", ErrNoBinary, err)
	}
	p := filepath.Join(dir, "temporal")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w (looked for %s)", ErrNoBinary, p)
	}
	return p, nil
}

// Opts configures Start. A nil *Opts means all defaults.
type Opts struct {
	// Bin is the Temporal CLI binary. Empty means FindBinary.
	Bin string
	// IP to bind. Empty means 127.0.0.1.
	IP string
	// Port is the frontend gRPC port. Zero picks a free port.
	Port int
	// UIPort is the Web UI port. Zero picks a free port; -1 runs headless.
	UIPort int
	// DBFile keeps state across restarts. Empty keeps it in memory.
	DBFile string
	// Output receives the server's stdout and stderr. Nil discards them.
	Output io.Writer
	// StartTimeout bounds the wait for the server to answer. Zero means 60s.
	StartTimeout time.Duration
	// DynamicConfig sets server dynamic config values (YAML or JSON), such
	// as {"matching.enableFairness": "true"}.
	DynamicConfig map[string]string
}

// FairnessOn is the dynamic config that makes the server hand out each task
// queue's backlog round robin across fairness keys (server 1.29:
// matching.enableFairness), so that keyed's runs, which carry their tenant as
// their key, are fair between tenants. `make demo` runs with it.
func FairnessOn() map[string]string {
	return map[string]string{"matching.enableFairness": "true"}
}

// FastDispatch is the dynamic config that lets a history shard read its
// transfer queue up to 100 times a second instead of 20 (server 1.29:
// history.transferProcessorMaxPollRPS): each step's task then reaches
// matching within a few milliseconds of being scheduled, instead of up to
// 50 ms later when the shard read its queue just before
// (docs/deployment.md, "Dispatch latency").
func FastDispatch() map[string]string {
	return map[string]string{"history.transferProcessorMaxPollRPS": "100"}
}

// Recommended is the dynamic config keyed recommends for a Temporal server:
// FairnessOn and FastDispatch. `make demo`, the compose file,
// internal/tempcluster and the tests' dev servers (ForTests) run with it.
func Recommended() map[string]string {
	out := FairnessOn()
	maps.Copy(out, FastDispatch())
	return out
}

// ForTests returns the options of a test's dev server: headless, with the
// dynamic config keyed recommends, so that tests meet the server its users
// run.
func ForTests() *Opts {
	return &Opts{UIPort: -1, DynamicConfig: Recommended()}
}

// Server is a running dev server.
type Server struct {
	cmd         *exec.Cmd
	addr        string
	uiAddr      string
	metricsAddr string
	done        chan error
}

// Start launches the dev server with keyed's search attributes registered
// and waits until its frontend answers a health check. The server also
// binds ports of its own choosing for its internal services, which another
// process may take in the meantime; a server that exits before it is ready
// is therefore started again on fresh ports, up to three times. Start
// returns an error wrapping ErrNoBinary when the binary is missing, and an
// error naming the command and quoting its last output when the server
// exits or does not answer in time.
func Start(ctx context.Context, opts *Opts) (*Server, error) {
	if opts == nil {
		opts = &Opts{}
	}
	bin := opts.Bin
	if bin == "" {
		var err error
		if bin, err = FindBinary(); err != nil {
			return nil, err
		}
	}
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		var s *Server
		var exited bool
		s, exited, err = start(ctx, bin, opts)
		if err == nil {
			return s, nil
		}
		if !exited || opts.Port != 0 || ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

func start(ctx context.Context, bin string, opts *Opts) (s *Server, exited bool, err error) {
	ip := opts.IP
	if ip == "" {
		ip = "127.0.0.1"
	}
	// Four distinct free ports, picked together so that none is handed out
	// twice: frontend, HTTP API, metrics and Web UI.
	ports, err := freePorts(ip, 4)
	if err != nil {
		return nil, false, fmt.Errorf("dev server: pick ports: %w", err)
	}
	port := opts.Port
	if port == 0 {
		port = ports[0]
	}
	args := []string{"server", "start-dev", "--ip", ip, "--port", strconv.Itoa(port),
		"--http-port", strconv.Itoa(ports[1]), "--metrics-port", strconv.Itoa(ports[2]), "--log-level", "warn"}
	s = &Server{addr: net.JoinHostPort(ip, strconv.Itoa(port)), done: make(chan error, 1),
		metricsAddr: "http://" + net.JoinHostPort(ip, strconv.Itoa(ports[2])) + "/metrics"}
	switch {
	case opts.UIPort < 0:
		args = append(args, "--headless")
	default:
		ui := opts.UIPort
		if ui == 0 {
			ui = ports[3]
		}
		args = append(args, "--ui-port", strconv.Itoa(ui))
		s.uiAddr = "http://" + net.JoinHostPort(ip, strconv.Itoa(ui))
	}
	for _, sa := range SearchAttributes() {
		args = append(args, "--search-attribute", sa)
	}
	if opts.DBFile != "" {
		args = append(args, "--db-filename", opts.DBFile)
	}
	for k, v := range opts.DynamicConfig {
		args = append(args, "--dynamic-config-value", k+"="+v)
	}
	tail := &tailBuffer{max: 4096}
	var out io.Writer = tail
	if opts.Output != nil {
		out = io.MultiWriter(opts.Output, tail)
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = out, out
	// Its own process group, so Stop can end the UI server child as well.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, false, fmt.Errorf("start %s %s: %w", bin, strings.Join(args, " "), err)
	}
	go func() { s.done <- s.cmd.Wait() }()

	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	if err := s.waitReady(ctx, timeout); err != nil {
		_ = s.Stop()
		return nil, errors.Is(err, errExited), fmt.Errorf("dev server (%s %s): %w; its last output:\n%s",
			bin, strings.Join(args, " "), err, tail.String())
	}
	return s, false, nil
}

// errExited is wrapped by waitReady when the server process ends first.
var errExited = errors.New("exited before it was ready")

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = b.buf[over:]
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		select {
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("%w: %v", errExited, err)
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s: %v", timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
		c, err := client.Dial(client.Options{HostPort: s.addr, Logger: quietLogger{}})
		if err != nil {
			last = err
			continue
		}
		_, err = c.CheckHealth(ctx, &client.CheckHealthRequest{})
		c.Close()
		if err == nil {
			return nil
		}
		last = err
	}
}

// Address returns the frontend's host:port, for client.Options.HostPort.
func (s *Server) Address() string { return s.addr }

// UIAddress returns the Web UI's URL, or "" when headless.
func (s *Server) UIAddress() string { return s.uiAddr }

// MetricsAddress returns the URL of the server's Prometheus metrics.
func (s *Server) MetricsAddress() string { return s.metricsAddr }

// PID returns the server's process ID, or 0 before it started.
func (s *Server) PID() int {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Namespace returns the namespace the server created, "default".
func (s *Server) Namespace() string { return "default" }

// Stop ends the server and its children and waits for it to exit.
func (s *Server) Stop() error {
	if s.cmd.Process == nil {
		return nil
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
	return nil
}

// freePorts returns n distinct free ports on ip. It holds every listener
// open until all are picked, so the kernel cannot hand one out twice.
func freePorts(ip string, n int) ([]int, error) {
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// quietLogger keeps the SDK's dial retries out of test output.
type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}

// RunTests is a test package's TestMain body: it starts one headless dev
// server for the whole package, hands it to use (to keep its address), runs
// the tests, stops the server and returns the exit code. Tests get
// ForTests's server; a run of benchmarks (-bench) gets the server as the
// CLI ships it, which the benchmark pages' tables were measured on. When the
// server cannot start it prints why and how to fix it, and fails the
// package instead of skipping anything:
//
//	func TestMain(m *testing.M) {
//		os.Exit(devserver.RunTests(m, "api", func(s *devserver.Server) { temporalAddr = s.Address() }))
//	}
func RunTests(m interface{ Run() int }, pkg string, use func(*Server)) int {
	opts := ForTests()
	if benchmarking() {
		opts.DynamicConfig = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	srv, err := Start(ctx, opts)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s tests need a Temporal dev server: %v\n"+
			"Run `make tools` to build bin/temporal, or set KEYED_TEMPORAL_BIN.\n", pkg, err)
		return 1
	}
	defer srv.Stop()
	use(srv)
	return m.Run()
}

// benchmarking reports whether the test binary was asked to run benchmarks.
func benchmarking() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	f := flag.Lookup("test.bench")
	return f != nil && f.Value.String() != ""
}
