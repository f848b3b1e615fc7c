// Command temporal-ui serves the Temporal Web UI (the ui-server the
// Temporal CLI embeds in `temporal server start-dev`, with its assets)
// against any frontend, such as the cluster `make cluster` runs.
//
//	temporal-ui -address 127.0.0.1:7233 -port 8233
package main

import (
	"flag"
	"log"
	"net"
	"strconv"

	uiserver "github.com/temporalio/ui-server/v2/server"
	uiconfig "github.com/temporalio/ui-server/v2/server/config"
	uiserveroptions "github.com/temporalio/ui-server/v2/server/server_options"
)

func main() {
	address := flag.String("address", "127.0.0.1:7233", "the Temporal frontend's gRPC host:port")
	ip := flag.String("ip", "127.0.0.1", "the IP to serve the UI on")
	port := flag.Int("port", 8233, "the port to serve the UI on")
	flag.Parse()
	if _, _, err := net.SplitHostPort(*address); err != nil {
		log.Fatalf("temporal-ui: -address %q: %v", *address, err)
	}
	srv := uiserver.NewServer(uiserveroptions.WithConfigProvider(&uiconfig.Config{
		Host:                *ip,
		Port:                *port,
		TemporalGRPCAddress: *address,
		EnableUI:            true,
		CORS:                uiconfig.CORS{CookieInsecure: true},
		HideLogs:            true,
	}))
	log.Printf("temporal-ui: serving http://%s for %s", net.JoinHostPort(*ip, strconv.Itoa(*port)), *address)
	if err := srv.Start(); err != nil {
		log.Fatalf("temporal-ui: %v", err)
	}
}
