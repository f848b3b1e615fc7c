package tempcluster

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"

	"github.com/keyedhq/keyed/internal/devserver"
)

// nodePorts are the ports of one server process. Membership ports are
// stored as smallint in cluster_membership, so every port is below 32768.
type nodePorts struct {
	FrontendGRPC, FrontendHTTP, FrontendMembership int
	HistoryGRPC, HistoryMembership                 int
	MatchingGRPC, MatchingMembership               int
	WorkerGRPC, WorkerMembership                   int
}

// configData fills nodeConfig for one node.
type configData struct {
	Host, Port, User, Password string
	Database, Visibility       string
	Shards, MaxConns           int
	Ports                      nodePorts
	LogLevel                   string
	DynamicConfig              string
}

// nodeConfig is the server's config/development-postgres12.yaml adapted:
// ports of the node's own, the databases of the cluster, no metrics or
// pprof listener, no archival, and the cluster's dynamic config file.
var nodeConfig = template.Must(template.New("node").Parse(`log:
  stdout: true
  level: {{.LogLevel}}
persistence:
  defaultStore: postgres-default
  visibilityStore: postgres-visibility
  numHistoryShards: {{.Shards}}
  datastores:
    postgres-default:
      sql:
        pluginName: "postgres12"
        databaseName: "{{.Database}}"
        connectAddr: "{{.Host}}:{{.Port}}"
        connectProtocol: "tcp"
        user: "{{.User}}"
        password: "{{.Password}}"
        maxConns: {{.MaxConns}}
        maxIdleConns: {{.MaxConns}}
        maxConnLifetime: "1h"
    postgres-visibility:
      sql:
        pluginName: "postgres12"
        databaseName: "{{.Visibility}}"
        connectAddr: "{{.Host}}:{{.Port}}"
        connectProtocol: "tcp"
        user: "{{.User}}"
        password: "{{.Password}}"
        maxConns: 2
        maxIdleConns: 2
        maxConnLifetime: "1h"
global:
  membership:
    maxJoinDuration: 30s
    broadcastAddress: "127.0.0.1"
services:
  frontend:
    rpc:
      grpcPort: {{.Ports.FrontendGRPC}}
      membershipPort: {{.Ports.FrontendMembership}}
      bindOnLocalHost: true
      httpPort: {{.Ports.FrontendHTTP}}
  matching:
    rpc:
      grpcPort: {{.Ports.MatchingGRPC}}
      membershipPort: {{.Ports.MatchingMembership}}
      bindOnLocalHost: true
  history:
    rpc:
      grpcPort: {{.Ports.HistoryGRPC}}
      membershipPort: {{.Ports.HistoryMembership}}
      bindOnLocalHost: true
  worker:
    rpc:
      grpcPort: {{.Ports.WorkerGRPC}}
      membershipPort: {{.Ports.WorkerMembership}}
      bindOnLocalHost: true
clusterMetadata:
  enableGlobalNamespace: false
  failoverVersionIncrement: 10
  masterClusterName: "active"
  currentClusterName: "active"
  clusterInformation:
    active:
      enabled: true
      initialFailoverVersion: 1
      rpcName: "frontend"
      rpcAddress: "127.0.0.1:{{.Ports.FrontendGRPC}}"
dcRedirectionPolicy:
  policy: "noop"
dynamicConfigClient:
  filepath: "{{.DynamicConfig}}"
  pollInterval: "10s"
`))

// DefaultDynamicConfig is the dynamic config every cluster starts with:
// keyed's recommended settings (devserver.Recommended: fairness on, so
// Priority.FairnessKey is honoured, and fast dispatch), namespace and
// search-attribute caches refreshed at once, as the dev server does.
func DefaultDynamicConfig() map[string]string {
	out := devserver.Recommended()
	out["system.forceSearchAttributesCacheRefreshOnRead"] = "true"
	out["system.namespaceCacheRefreshInterval"] = "1s"
	return out
}

// writeDynamicConfig writes settings as the server's dynamic config file
// (every value global, unconstrained) and returns its path.
func writeDynamicConfig(dir string, settings map[string]string) (string, error) {
	var sb strings.Builder
	for k, v := range settings {
		fmt.Fprintf(&sb, "%s:\n  - value: %s\n", k, v)
	}
	path := filepath.Join(dir, "dynamicconfig.yaml")
	return path, os.WriteFile(path, []byte(sb.String()), 0o644)
}

// writeNodeConfig writes node i's config as <dir>/config/node<i>.yaml, for
// `temporal-server --config <dir>/config --env node<i>`.
func writeNodeConfig(dir string, i int, d configData) error {
	if err := os.MkdirAll(filepath.Join(dir, "config"), 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "config", "node"+strconv.Itoa(i)+".yaml"))
	if err != nil {
		return err
	}
	if err := nodeConfig.Execute(f, d); err != nil {
		_ = f.Close()
		return fmt.Errorf("render node %d's config: %w", i, err)
	}
	return f.Close()
}

// pgTarget is where the cluster's databases live, from a postgres:// URL.
type pgTarget struct{ host, port, user, password string }

func parsePG(raw string) (pgTarget, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return pgTarget{}, fmt.Errorf("parse database URL: want postgres://user@host:port/db, got %q", raw)
	}
	t := pgTarget{host: u.Hostname(), port: u.Port(), user: u.User.Username()}
	t.password, _ = u.User.Password()
	if t.host == "" {
		t.host = "127.0.0.1"
	}
	if t.port == "" {
		t.port = "5432"
	}
	if t.user == "" {
		t.user = "postgres"
	}
	return t, nil
}

// lowPorts returns n distinct ports below 32768 that are free on ip now.
// The kernel hands out ephemeral ports from 32768 up, so a port below it
// is taken only by a process that chose it, as this one does: random
// picks, each checked by binding it.
func lowPorts(ip string, n int, pick func() int) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for tries := 0; len(out) < n; tries++ {
		if tries > 100*n {
			return nil, fmt.Errorf("no %d free ports below 32768 on %s", n, ip)
		}
		p := pick()
		if seen[p] {
			continue
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(p)))
		if err != nil {
			continue
		}
		_ = l.Close()
		out = append(out, p)
	}
	return out, nil
}
