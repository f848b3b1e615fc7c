// Package pgcluster runs a private PostgreSQL server for one test: initdb
// into a temporary directory, pg_ctl start on a free port with trust
// authentication, and stop and removal when the test ends. A test that
// restarts or stops Postgres on purpose uses one, so that the machine's
// shared server (DATABASE_URL), which other tests use at the same time,
// keeps running.
//
//	c := pgcluster.New(t, nil)
//	pool := dbtest.Connect(t, c.URL())
//	…
//	require.NoError(t, c.Restart(ctx, pgcluster.Immediate))
//
// The server binaries come from $KEYED_PG_BINDIR, or else the newest
// /usr/lib/postgresql/*/bin. initdb refuses to run as root, so when the
// test runs as root every server command runs as the postgres user through
// runuser, in a directory owned by that user.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Shutdown modes of pg_ctl's -m flag, for Stop and Restart.
const (
	// Smart waits for the clients to disconnect.
	Smart = "smart"
	// Fast disconnects the clients, rolling back their transactions, and
	// shuts down cleanly.
	Fast = "fast"
	// Immediate kills the server processes at once; the next start
	// recovers from the WAL, as after a crash.
	Immediate = "immediate"
)

// Opts configures New. A nil *Opts means all defaults.
type Opts struct {
	// BinDir holds initdb, pg_ctl and postgres. Empty means
	// $KEYED_PG_BINDIR, or else the newest /usr/lib/postgresql/*/bin.
	BinDir string
	// Settings are extra postgresql.conf settings, such as
	// {"max_connections": "300"}. They override the defaults, which favour
	// speed over durability against a machine crash: fsync and full page
	// writes are off. Synchronous commit stays on, so that a server crash,
	// including an immediate shutdown, loses no committed transaction;
	// turning it off makes an immediate restart lose the last commits.
	Settings map[string]string
}

// Cluster is a private Postgres server. Its methods are not safe for
// concurrent use.
type Cluster struct {
	bin  string
	dir  string // owned by the server's user; holds data, the socket and the log
	port int
	user *user.User // nil when the test does not run as root
}

// New creates and starts a private cluster and registers its stop and
// removal with t.Cleanup. It fails the test, saying what to install, when
// the server binaries are missing, and with the server's log when it does
// not start.
func New(t testing.TB, opts *Opts) *Cluster {
	t.Helper()
	if opts == nil {
		opts = &Opts{}
	}
	bin, err := binDir(opts.BinDir)
	if err != nil {
		t.Fatalf("pgcluster: %v; install PostgreSQL (`apt-get install -y postgresql`) or set KEYED_PG_BINDIR", err)
	}
	c := &Cluster{bin: bin}
	if os.Geteuid() == 0 {
		if c.user, err = user.Lookup("postgres"); err != nil {
			t.Fatalf("pgcluster: running as root needs a postgres user to run the server as: %v", err)
		}
	}
	c.dir, err = os.MkdirTemp("", "pgcluster-")
	if err != nil {
		t.Fatalf("pgcluster: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(ctx, Immediate); err != nil && !errors.Is(err, errNotRunning) {
			t.Logf("pgcluster: stop: %v", err)
		}
		if err := os.RemoveAll(c.dir); err != nil {
			t.Logf("pgcluster: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.init(ctx, opts.Settings); err != nil {
		t.Fatalf("pgcluster: %v", err)
	}
	// The free port may be taken before the server binds it: try others.
	for try := 1; ; try++ {
		err := c.Start(ctx)
		if err == nil {
			return c
		}
		if try == 3 {
			t.Fatalf("pgcluster: %v\nserver log:\n%s", err, c.Log())
		}
		if err := c.newPort(); err != nil {
			t.Fatalf("pgcluster: %v", err)
		}
	}
}

// URL returns the connection string of the cluster's postgres database as
// the postgres superuser, with TLS off.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port returns the TCP port the cluster listens on (127.0.0.1 only).
func (c *Cluster) Port() int { return c.port }

// Log returns the server's log so far, for a failure message.
func (c *Cluster) Log() string {
	b, err := os.ReadFile(c.logFile())
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	return string(b)
}

// errNotRunning is returned by Stop when the server is not running.
var errNotRunning = errors.New("server is not running")

// Start starts the cluster's server and waits until it accepts connections.
// It returns pg_ctl's output in the error if the server does not start.
func (c *Cluster) Start(ctx context.Context) error {
	if _, err := c.pgctl(ctx, "start", "-l", c.logFile()); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	return nil
}

// Stop shuts the server down in mode (Smart, Fast or Immediate) and waits
// until it has. It returns pg_ctl's output in the error if it fails.
func (c *Cluster) Stop(ctx context.Context, mode string) error {
	if out, err := c.pgctl(ctx, "status"); err != nil {
		return fmt.Errorf("stop: %w: %s", errNotRunning, out)
	}
	if _, err := c.pgctl(ctx, "stop", "-m", mode); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	return nil
}

// Restart shuts the server down in mode (Smart, Fast or Immediate) and
// starts it again on the same port, waiting until it accepts connections.
// Every client connection is lost; with Immediate, open transactions are
// lost as in a crash and the server recovers from the WAL.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	if _, err := c.pgctl(ctx, "restart", "-m", mode, "-l", c.logFile()); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *Cluster) logFile() string { return filepath.Join(c.dir, "server.log") }

// init runs initdb and writes the settings, with a free port, into
// postgresql.conf.
func (c *Cluster) init(ctx context.Context, extra map[string]string) error {
	if err := c.own(c.dir); err != nil {
		return err
	}
	if _, err := c.run(ctx, "initdb", "-D", c.dataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"); err != nil {
		return fmt.Errorf("initdb: %w", err)
	}
	settings := map[string]string{
		"listen_addresses":        "'127.0.0.1'",
		"unix_socket_directories": "'" + c.dir + "'",
		"fsync":                   "off",
		"full_page_writes":        "off",
		"max_connections":         "200",
	}
	for k, v := range extra {
		settings[k] = v
	}
	var conf strings.Builder
	conf.WriteString("\n# pgcluster\n")
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		fmt.Fprintf(&conf, "%s = %s\n", k, settings[k])
	}
	if err := c.appendConf(conf.String()); err != nil {
		return err
	}
	return c.newPort()
}

// newPort picks a free port for the next start. A later line of
// postgresql.conf overrides an earlier one.
func (c *Cluster) newPort() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	c.port = port
	return c.appendConf(fmt.Sprintf("port = %d\n", port))
}

// appendConf appends text to postgresql.conf, which keeps its owner.
func (c *Cluster) appendConf(text string) error {
	f, err := os.OpenFile(filepath.Join(c.dataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("write postgresql.conf: %w", err)
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return fmt.Errorf("write postgresql.conf: %w", err)
	}
	return f.Close()
}

// pgctl runs pg_ctl on the cluster's data directory, waiting up to a
// minute for the operation, and returns its output.
func (c *Cluster) pgctl(ctx context.Context, args ...string) (string, error) {
	return c.run(ctx, "pg_ctl", append([]string{"-D", c.dataDir(), "-w", "-t", "60"}, args...)...)
}

// run runs one of the server binaries, as the postgres user when the test
// runs as root, and returns its combined output, quoted in the error.
func (c *Cluster) run(ctx context.Context, name string, args ...string) (string, error) {
	path := filepath.Join(c.bin, name)
	var cmd *exec.Cmd
	if c.user != nil {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.user.Username, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = c.dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// pg_ctl start leaves the server running with our pipes open unless it
	// logs to a file, which every start here does; WaitDelay covers the rest.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// own gives dir to the server's user when the test runs as root.
func (c *Cluster) own(dir string) error {
	if c.user == nil {
		return nil
	}
	uid, err := strconv.Atoi(c.user.Uid)
	if err != nil {
		return fmt.Errorf("postgres uid %q: %w", c.user.Uid, err)
	}
	gid, err := strconv.Atoi(c.user.Gid)
	if err != nil {
		return fmt.Errorf("postgres gid %q: %w", c.user.Gid, err)
	}
	return os.Chown(dir, uid, gid)
}

// binDir returns the directory of the server binaries.
func binDir(dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv("KEYED_PG_BINDIR")
	}
	if dir == "" {
		found, err := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
		if err != nil {
			return "", err
		}
		// Sort by major version number, so that 15 comes after 9.6.
		slices.SortFunc(found, func(a, b string) int { return majorOf(a) - majorOf(b) })
		if len(found) == 0 {
			return "", errors.New("no /usr/lib/postgresql/*/bin/initdb")
		}
		dir = filepath.Dir(found[len(found)-1])
	}
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("no %s in %s", name, dir)
		}
	}
	return dir, nil
}

// majorOf returns the major version in a path like
// /usr/lib/postgresql/15/bin/initdb, or 0.
func majorOf(path string) int {
	v := filepath.Base(filepath.Dir(filepath.Dir(path)))
	n, err := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	if err != nil {
		return 0
	}
	return n
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
