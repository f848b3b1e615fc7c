// Package tempcluster runs a self-hosted Temporal cluster on this machine
// for make cluster and the cluster tests: two or more temporal-server
// processes (frontend, history, matching and worker each), joined by
// membership, on Postgres persistence and SQL visibility in databases of
// their own, the schema set up by the server's own temporal-sql-tool, with
// keyed's search attributes registered, a TCP load balancer in front of the
// frontends (what clients dial) and optionally the Web UI. It downloads
// nothing: the binaries come from `make tools`.
package tempcluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/toolbin"
)

// The binaries `make tools` builds into bin/.
const (
	ServerBinary  = "temporal-server"
	SQLToolBinary = "temporal-sql-tool"
	UIBinary      = "temporal-ui"
)

// ErrNoBinary means a binary of the cluster was not found.
var ErrNoBinary = errors.New("temporal server tools not found: run `make tools` (it builds bin/temporal-server, bin/temporal-sql-tool and bin/temporal-ui), or set KEYED_TEMPORAL_TOOLS")

// Namespace is the namespace every cluster registers, as the dev server's.
const Namespace = "default"

// Opts configures Start. A nil *Opts means all defaults.
type Opts struct {
	// BinDir holds the binaries. Empty means $KEYED_TEMPORAL_TOOLS, or
	// else bin/ in the nearest directory above the working one with go.mod.
	BinDir string
	// DatabaseURL is a superuser URL of the Postgres the cluster's two
	// databases are created on. Empty means $DATABASE_URL, or else
	// postgres://postgres@127.0.0.1:5432/postgres.
	DatabaseURL string
	// Database names the persistence database; visibility is it plus
	// "_visibility". Empty means a fresh random name, dropped by Stop.
	Database string
	// Nodes is the number of server processes. Zero means 2.
	Nodes int
	// Shards is the number of history shards. Zero means 8.
	Shards int
	// MaxConns bounds each node's persistence pool. Zero means 10.
	MaxConns int
	// Port is the load balancer's port. Zero picks a free port.
	Port int
	// UIPort is the Web UI's port. Zero picks a free port; -1 runs none.
	UIPort int
	// DynamicConfig overrides DefaultDynamicConfig's settings (YAML values).
	DynamicConfig map[string]string
	// LogLevel of the servers. Empty means "warn".
	LogLevel string
	// Output receives the servers' output. Nil keeps it in Dir's logs only.
	Output io.Writer
	// Keep keeps the databases and Dir on Stop.
	Keep bool
	// StartTimeout bounds the wait for the cluster. Zero means 3 minutes.
	StartTimeout time.Duration
}

// Cluster is a running cluster. Its methods are safe for concurrent use.
type Cluster struct {
	opts            Opts
	bin             string
	dir             string
	pg              pgTarget
	adminURL        string
	database, visDB string
	proxy           *proxy
	ui              *exec.Cmd
	uiAddr          string
	mu              sync.Mutex
	nodes           []*node
	stopped         bool
}

type node struct {
	ports nodePorts
	cmd   *exec.Cmd
	done  chan struct{}
	log   *os.File
}

// FindBinDir returns $KEYED_TEMPORAL_TOOLS if set, else bin/ in the
// nearest directory above the working directory that holds go.mod; an
// error wrapping ErrNoBinary if a binary is missing there.
func FindBinDir() (string, error) {
	dir := os.Getenv("KEYED_TEMPORAL_TOOLS")
	if dir == "" {
		var err error
		if dir, err = toolbin.Dir(); err != nil {
			return "", fmt.Errorf("%w (%v)", ErrNoBinary, err)
		}
	}
	for _, b := range []string{ServerBinary, SQLToolBinary, UIBinary} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%w (looked for %s)", ErrNoBinary, filepath.Join(dir, b))
		}
	}
	return dir, nil
}

// Start creates the cluster's databases and schema, starts its nodes and
// the load balancer, registers the namespace and keyed's search attributes
// (devserver.SearchAttributes) and waits until every frontend serves them.
// On an error it stops what it started and says which step failed, with
// the servers' last output.
func Start(ctx context.Context, opts *Opts) (*Cluster, error) {
	c := &Cluster{}
	if opts != nil {
		c.opts = *opts
	}
	o := &c.opts
	o.Nodes = cmp.Or(o.Nodes, 2)
	o.Shards = cmp.Or(o.Shards, 8)
	o.MaxConns = cmp.Or(o.MaxConns, 10)
	o.StartTimeout = cmp.Or(o.StartTimeout, 3*time.Minute)
	if o.LogLevel == "" {
		o.LogLevel = "warn"
	}
	var err error
	if c.bin = o.BinDir; c.bin == "" {
		if c.bin, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	c.adminURL = cmp.Or(o.DatabaseURL, os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	if c.pg, err = parsePG(c.adminURL); err != nil {
		return nil, err
	}
	c.database = o.Database
	if c.database == "" {
		c.database = "keyed_temporal_" + randomID(4)
	}
	c.visDB = c.database + "_visibility"
	if c.dir, err = os.MkdirTemp("", "tempcluster-"); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.StartTimeout)
	defer cancel()
	if err := c.start(ctx); err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("temporal cluster: %w", err)
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	if err := c.setupSchema(ctx); err != nil {
		return err
	}
	settings := DefaultDynamicConfig()
	for k, v := range c.opts.DynamicConfig {
		settings[k] = v
	}
	dyn, err := writeDynamicConfig(c.dir, settings)
	if err != nil {
		return fmt.Errorf("write the dynamic config: %w", err)
	}
	ports, err := lowPorts("127.0.0.1", 9*c.opts.Nodes, func() int { return 20000 + mathrand.IntN(12000) })
	if err != nil {
		return err
	}
	var frontends []string
	for i := range c.opts.Nodes {
		p := ports[9*i : 9*i+9]
		np := nodePorts{p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]}
		d := configData{Host: c.pg.host, Port: c.pg.port, User: c.pg.user, Password: c.pg.password,
			Database: c.database, Visibility: c.visDB, Shards: c.opts.Shards, MaxConns: c.opts.MaxConns,
			Ports: np, LogLevel: c.opts.LogLevel, DynamicConfig: dyn}
		if err := writeNodeConfig(c.dir, i, d); err != nil {
			return err
		}
		c.nodes = append(c.nodes, &node{ports: np})
		frontends = append(frontends, net.JoinHostPort("127.0.0.1", strconv.Itoa(np.FrontendGRPC)))
	}
	if c.proxy, err = newProxy("127.0.0.1", c.opts.Port, frontends); err != nil {
		return fmt.Errorf("start the load balancer: %w", err)
	}
	// Node 0 first: on an empty database the first node writes the
	// cluster's metadata, and a second racing it exits on the duplicate.
	if err := c.Restart(ctx, 0); err != nil {
		return err
	}
	for i := 1; i < len(c.nodes); i++ {
		if err := c.StartNode(i); err != nil {
			return err
		}
	}
	for i := 1; i < len(c.nodes); i++ {
		if err := c.waitHealthy(ctx, i); err != nil {
			return err
		}
	}
	if err := c.register(ctx); err != nil {
		return err
	}
	if c.opts.UIPort >= 0 {
		if err := c.startUI(); err != nil {
			return err
		}
	}
	return nil
}

// setupSchema creates the two databases and sets up the server's schema
// with temporal-sql-tool and its embedded postgresql/v12 schemas.
func (c *Cluster) setupSchema(ctx context.Context) error {
	for _, s := range []struct{ db, schema string }{{c.database, "temporal"}, {c.visDB, "visibility"}} {
		for _, args := range [][]string{
			{"create-database"},
			{"setup-schema", "-v", "0.0"},
			{"update-schema", "--schema-name", "postgresql/v12/" + s.schema},
		} {
			if err := c.sqlTool(ctx, s.db, args...); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *Cluster) sqlTool(ctx context.Context, db string, args ...string) error {
	all := []string{"--plugin", "postgres12", "--ep", c.pg.host, "-p", c.pg.port, "-u", c.pg.user, "--db", db}
	if c.pg.password != "" {
		all = append(all, "--pw", c.pg.password)
	}
	all = append(all, args...)
	out, err := exec.CommandContext(ctx, filepath.Join(c.bin, SQLToolBinary), all...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", SQLToolBinary, strings.Join(all, " "), err, lastLines(string(out), 10))
	}
	return nil
}

// StartNode starts node i's server process, on its ports of before when
// it ran already (after Kill). It does not wait for it to serve.
func (c *Cluster) StartNode(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if n.cmd != nil {
		select {
		case <-n.done:
		default:
			return fmt.Errorf("node %d is running", i)
		}
	}
	logf, err := os.OpenFile(filepath.Join(c.dir, fmt.Sprintf("node%d.log", i)), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	var out io.Writer = logf
	if c.opts.Output != nil {
		out = io.MultiWriter(logf, c.opts.Output)
	}
	args := []string{"--root", c.dir, "--config", "config", "--env", "node" + strconv.Itoa(i), "--allow-no-auth", "start",
		"--service", "frontend", "--service", "history", "--service", "matching", "--service", "worker"}
	cmd := exec.Command(filepath.Join(c.bin, ServerBinary), args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start node %d: %w", i, err)
	}
	n.cmd, n.log, n.done = cmd, logf, make(chan struct{})
	go func(done chan struct{}) {
		_ = cmd.Wait()
		_ = logf.Close()
		close(done)
	}(n.done)
	return nil
}

// Kill SIGKILLs node i's server process and waits until it has exited.
func (c *Cluster) Kill(i int) error {
	c.mu.Lock()
	n := c.nodes[i]
	c.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return fmt.Errorf("node %d never started", i)
	}
	if err := syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill node %d: %w", i, err)
	}
	<-n.done
	return nil
}

// Restart starts node i (again, after Kill) and waits until its frontend
// answers a health check.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	if err := c.StartNode(i); err != nil {
		return err
	}
	return c.waitHealthy(ctx, i)
}

// waitHealthy waits until node i's frontend answers a health check.
func (c *Cluster) waitHealthy(ctx context.Context, i int) error {
	addr := c.NodeAddress(i)
	var last error
	for {
		c.mu.Lock()
		done := c.nodes[i].done
		c.mu.Unlock()
		select {
		case <-done:
			return fmt.Errorf("node %d exited before it was ready; its last output:\n%s", i, c.NodeLog(i, 30))
		case <-ctx.Done():
			return fmt.Errorf("node %d not ready: %v (%w); its last output:\n%s", i, last, ctx.Err(), c.NodeLog(i, 30))
		case <-time.After(250 * time.Millisecond):
		}
		tc, err := client.Dial(client.Options{HostPort: addr, Logger: quietLogger{}})
		if err == nil {
			_, err = tc.CheckHealth(ctx, &client.CheckHealthRequest{})
			tc.Close()
		}
		if err == nil {
			return nil
		}
		last = err
	}
}

// register registers the namespace and the search attributes through the
// load balancer, retrying while the nodes join and take their shards, and
// waits until every frontend lists them.
func (c *Cluster) register(ctx context.Context) error {
	want := map[string]enumspb.IndexedValueType{}
	for _, sa := range devserver.SearchAttributes() {
		name, typ, _ := strings.Cut(sa, "=")
		t, ok := indexedTypes[typ]
		if !ok {
			return fmt.Errorf("search attribute %s: unknown type %q", name, typ)
		}
		want[name] = t
	}
	tc, err := client.Dial(client.Options{HostPort: c.Address(), Logger: quietLogger{}})
	if err != nil {
		return fmt.Errorf("dial the cluster: %w", err)
	}
	defer tc.Close()
	steps := []struct {
		what string
		do   func() error
	}{
		{"register namespace " + Namespace, func() error {
			_, err := tc.WorkflowService().RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
				Namespace: Namespace, WorkflowExecutionRetentionPeriod: durationpb.New(24 * time.Hour)})
			var exists *serviceerror.NamespaceAlreadyExists
			if errors.As(err, &exists) {
				return nil
			}
			return err
		}},
		{"add the search attributes", func() error {
			_, err := tc.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
				Namespace: Namespace, SearchAttributes: want})
			var exists *serviceerror.AlreadyExists
			if errors.As(err, &exists) {
				return nil
			}
			return err
		}},
	}
	for _, s := range steps {
		if err := retry(ctx, s.do); err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
	}
	for i := range c.nodes {
		err := retry(ctx, func() error {
			nc, err := client.Dial(client.Options{HostPort: c.NodeAddress(i), Namespace: Namespace, Logger: quietLogger{}})
			if err != nil {
				return err
			}
			defer nc.Close()
			resp, err := nc.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: Namespace})
			if err != nil {
				return err
			}
			for name := range want {
				if _, ok := resp.GetCustomAttributes()[name]; !ok {
					return fmt.Errorf("search attribute %s not listed yet", name)
				}
			}
			_, err = nc.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{Namespace: Namespace})
			return err
		})
		if err != nil {
			return fmt.Errorf("node %d serves the namespace: %w", i, err)
		}
	}
	return nil
}

// indexedTypes maps pipeline.SearchAttribute's Type to Temporal's.
var indexedTypes = map[string]enumspb.IndexedValueType{
	"Text": enumspb.INDEXED_VALUE_TYPE_TEXT, "Keyword": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	"Int": enumspb.INDEXED_VALUE_TYPE_INT, "Double": enumspb.INDEXED_VALUE_TYPE_DOUBLE,
	"Bool": enumspb.INDEXED_VALUE_TYPE_BOOL, "Datetime": enumspb.INDEXED_VALUE_TYPE_DATETIME,
	"KeywordList": enumspb.INDEXED_VALUE_TYPE_KEYWORD_LIST,
}

// retry runs fn every half second until it succeeds or ctx ends.
func retry(ctx context.Context, fn func() error) error {
	for {
		err := fn()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// startUI starts temporal-ui against the load balancer.
func (c *Cluster) startUI() error {
	port := c.opts.UIPort
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		port = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
	}
	logf, err := os.Create(filepath.Join(c.dir, "ui.log"))
	if err != nil {
		return err
	}
	c.ui = exec.Command(filepath.Join(c.bin, UIBinary), "-address", c.Address(), "-port", strconv.Itoa(port))
	c.ui.Stdout, c.ui.Stderr = logf, logf
	c.ui.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.ui.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start the Web UI: %w", err)
	}
	go func() { _ = c.ui.Wait(); _ = logf.Close() }()
	c.uiAddr = "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return nil
}

// Address returns the load balancer's host:port, for client.Options.HostPort.
func (c *Cluster) Address() string { return c.proxy.addr() }

// NodeAddress returns node i's own frontend host:port.
func (c *Cluster) NodeAddress(i int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.nodes[i].ports.FrontendGRPC))
}

// Nodes returns the number of server processes.
func (c *Cluster) Nodes() int { return len(c.nodes) }

// PIDs returns the server processes' IDs, 0 for a node not running.
func (c *Cluster) PIDs() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int, len(c.nodes))
	for i, n := range c.nodes {
		if n.cmd != nil && n.cmd.Process != nil {
			select {
			case <-n.done:
			default:
				out[i] = n.cmd.Process.Pid
			}
		}
	}
	return out
}

// UIAddress returns the Web UI's URL, or "" when none runs.
func (c *Cluster) UIAddress() string { return c.uiAddr }

// Databases returns the persistence and visibility databases' names.
func (c *Cluster) Databases() (persistence, visibility string) { return c.database, c.visDB }

// Dir returns the directory of the nodes' configs and logs.
func (c *Cluster) Dir() string { return c.dir }

// NodeLog returns the last n lines of node i's log.
func (c *Cluster) NodeLog(i, n int) string {
	b, err := os.ReadFile(filepath.Join(c.dir, fmt.Sprintf("node%d.log", i)))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	return lastLines(string(b), n)
}

// Stop ends the UI, the nodes and the load balancer and, unless Opts.Keep,
// drops the databases and removes Dir. It returns the first error.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	nodes := c.nodes
	c.mu.Unlock()
	if c.ui != nil && c.ui.Process != nil {
		_ = c.ui.Process.Kill()
	}
	for _, n := range nodes {
		if n.cmd == nil || n.cmd.Process == nil {
			continue
		}
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-n.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			<-n.done
		}
	}
	if c.proxy != nil {
		c.proxy.close()
	}
	if c.opts.Keep {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := c.dropDatabases(ctx)
	return errors.Join(err, os.RemoveAll(c.dir))
}

func (c *Cluster) dropDatabases(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.adminURL)
	if err != nil {
		return fmt.Errorf("drop the cluster's databases: %w", err)
	}
	defer conn.Close(ctx)
	for _, db := range []string{c.database, c.visDB} {
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", db, err)
		}
	}
	return nil
}

// randomID returns 2n random lowercase letters and digits (n at most 13).
func randomID(n int) string {
	return strings.ToLower(rand.Text())[:2*n]
}

// lastLines returns the last n lines of s, each cut at 400 bytes (the
// server logs stack traces on one line).
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	lines = lines[max(len(lines)-n, 0):]
	for i, l := range lines {
		if len(l) > 400 {
			lines[i] = l[:400] + "…"
		}
	}
	return strings.Join(lines, "\n")
}

// quietLogger keeps the SDK's dial retries out of the output.
type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}
