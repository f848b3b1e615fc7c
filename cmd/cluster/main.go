// Command cluster runs a self-hosted Temporal cluster on this machine
// (internal/tempcluster): two or more temporal-server processes on
// Postgres persistence and SQL visibility, keyed's search attributes
// registered, a load balancer in front of the frontends and the Web UI on
// it, until Ctrl-C. Run it through `make cluster`; point a worker at it
// with TEMPORAL_ADDRESS=<the address it prints>.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/keyedhq/keyed/internal/tempcluster"
)

func main() {
	var o tempcluster.Opts
	flag.IntVar(&o.Nodes, "nodes", 2, "server `processes`, each frontend, history, matching and worker")
	flag.IntVar(&o.Port, "port", 7233, "the load balancer's `port`, what clients dial (0 picks a free one)")
	flag.IntVar(&o.UIPort, "ui-port", 8233, "the Web UI's `port` (0 picks a free one, -1 runs none)")
	flag.StringVar(&o.Database, "database", "", "persistence `database` (visibility is it plus _visibility); empty means a fresh one, dropped on exit")
	flag.BoolVar(&o.Keep, "keep", false, "keep the databases and the nodes' directory on exit")
	flag.Parse()
	if err := run(&o); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func run(o *tempcluster.Opts) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("starting a %d-node Temporal cluster on Postgres...\n", o.Nodes)
	c, err := tempcluster.Start(ctx, o)
	if err != nil {
		return err
	}
	db, vis := c.Databases()
	fmt.Printf("Temporal cluster up: TEMPORAL_ADDRESS=%s (load balancer), namespace %s\n", c.Address(), tempcluster.Namespace)
	for i := range c.Nodes() {
		fmt.Printf("  node %d: frontend %s, pid %d\n", i, c.NodeAddress(i), c.PIDs()[i])
	}
	fmt.Printf("  databases %s and %s; configs and logs in %s\n", db, vis, c.Dir())
	if ui := c.UIAddress(); ui != "" {
		fmt.Printf("  Web UI %s\n", ui)
	}
	fmt.Println("Ctrl-C stops it.")
	<-ctx.Done()
	fmt.Println("stopping...")
	return c.Stop()
}
