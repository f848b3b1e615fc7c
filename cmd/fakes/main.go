// Command fakes serves the fakes of every provider in
// internal/fakeproviders' table, each on its own port (Fake.Port), for the
// demo and docker-compose.
//
// The host they listen on comes from -host or FAKE_HOST (default
// 127.0.0.1). The fake SendGrid's Email Activity API shows a message
// -sendgrid-index-lag (or FAKE_SENDGRID_INDEX_LAG, a Go duration such as
// "2s") after it was accepted.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/keyedhq/keyed/internal/fakeproviders"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
)

func main() {
	host := flag.String("host", cmp.Or(os.Getenv("FAKE_HOST"), "127.0.0.1"), "the host the fakes listen on, each on its own port")
	indexLag := flag.Duration("sendgrid-index-lag", envDuration("FAKE_SENDGRID_INDEX_LAG"), "how long the fake SendGrid's Email Activity API takes to show an accepted message")
	flag.Parse()
	if *indexLag < 0 {
		slog.Error("fakes: -sendgrid-index-lag is negative", "lag", indexLag.String())
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fakes := map[string]serve{}
	for _, f := range fakeproviders.Fakes {
		h := f.New()
		if f.Base == "SENDGRID_API_BASE" {
			h = fakesendgrid.New(&fakesendgrid.Opts{IndexLag: *indexLag})
		}
		fakes[f.Base] = serve{net.JoinHostPort(*host, strconv.Itoa(f.Port)), h}
	}
	if err := run(ctx, fakes); err != nil {
		slog.Error("fakes failed", "err", err)
		os.Exit(1)
	}
}

// envDuration returns the duration in the environment variable name, or 0
// when it is unset. A malformed value stops the program.
func envDuration(name string) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		slog.Error("fakes: bad duration", "env", name, "err", err)
		os.Exit(2)
	}
	return d
}

type serve struct {
	addr    string
	handler http.Handler
}

// run serves each fake until ctx is done or one of them fails.
func run(ctx context.Context, fakes map[string]serve) error {
	errc := make(chan error, len(fakes))
	var servers []*http.Server
	for name, f := range fakes {
		ln, err := net.Listen("tcp", f.addr)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: f.handler, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		slog.Info("listening", "fake", name, "addr", "http://"+ln.Addr().String())
		go func() { errc <- srv.Serve(ln) }()
	}
	var err error
	select {
	case <-ctx.Done():
		slog.Info("shutting down")
	case err = <-errc:
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range servers {
		err = errors.Join(err, srv.Shutdown(shutdownCtx))
	}
	return err
}
