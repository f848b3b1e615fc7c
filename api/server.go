package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/keyedhq/keyed/internal/tracing"
)

// Defaults of ServerOpts.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 15 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	// MaxHeaderBytes bounds a request's headers (431 above it), and so
	// what each connection can make the server buffer; net/http's default
	// is 1 MiB.
	MaxHeaderBytes       = 64 << 10
	DefaultPruneInterval = time.Hour
)

// ServerOpts configures a Server. A nil *ServerOpts means all defaults.
type ServerOpts struct {
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout are
	// http.Server's. Zero means the Default… constants.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxConns caps the connections the server holds open. At the cap a
	// new connection closes the one idle longest between requests, or
	// waits in the kernel's backlog until one closes. Zero means
	// DefaultMaxConns(); negative is an error.
	MaxConns int
	// PruneInterval is how often the server deletes idempotency records
	// older than Retention. Zero means DefaultPruneInterval; negative never
	// prunes.
	PruneInterval time.Duration
	// Logger receives start, stop and prune records. Nil means
	// slog.Default().
	Logger *slog.Logger
	// TracerProvider, when set, gives each request a server span (named
	// by its route pattern), continuing the caller's W3C trace context;
	// an order created in the request carries it to the outbox. Nil
	// means no tracing and no middleware (see internal/tracing).
	TracerProvider trace.TracerProvider
}

// Server serves a Handler over HTTP with Start and Stop, for an fx
// lifecycle or a main function, and prunes expired idempotency records in
// the background. Stop shuts down gracefully: it stops accepting
// connections and waits for in-flight requests.
type Server struct {
	handler  *Handler
	srv      *http.Server
	prune    time.Duration
	logger   *slog.Logger
	maxConns int

	mu      sync.Mutex
	ln      *connLimiter
	serving chan struct{}
	stop    context.CancelFunc
	pruned  chan struct{}
}

// NewServer returns a Server for h listening on addr (host:port; port 0
// picks a free one at Start). It returns an error if h is nil or addr is
// malformed.
func NewServer(addr string, h *Handler, opts *ServerOpts) (*Server, error) {
	if h == nil {
		return nil, errors.New("api: NewServer: handler is nil")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("api: NewServer: address %q: %w", addr, err)
	}
	if opts == nil {
		opts = &ServerOpts{}
	}
	if opts.MaxConns < 0 {
		return nil, fmt.Errorf("api: NewServer: MaxConns %d is negative", opts.MaxConns)
	}
	or := func(v, def time.Duration) time.Duration {
		if v == 0 {
			return def
		}
		return v
	}
	s := &Server{handler: h, prune: or(opts.PruneInterval, DefaultPruneInterval), logger: opts.Logger, maxConns: opts.MaxConns}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	if s.maxConns == 0 {
		s.maxConns = DefaultMaxConns()
	}
	var handler http.Handler = h
	if opts.TracerProvider != nil {
		handler = otelhttp.NewHandler(h, "keyed.api",
			otelhttp.WithTracerProvider(opts.TracerProvider), otelhttp.WithPropagators(tracing.Propagator))
	}
	s.srv = &http.Server{
		Addr:              addr,
		Handler:           handler,
		ReadHeaderTimeout: or(opts.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		ReadTimeout:       or(opts.ReadTimeout, DefaultReadTimeout),
		WriteTimeout:      or(opts.WriteTimeout, DefaultWriteTimeout),
		IdleTimeout:       or(opts.IdleTimeout, DefaultIdleTimeout),
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// Start binds the address and serves in the background; it returns once
// the socket is bound, as an fx OnStart hook must. It returns the bind
// error, or an error if the server was started before.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return errors.New("api server already started")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.srv.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.srv.Addr, err)
	}
	s.ln, s.serving = newConnLimiter(ln, s.maxConns, newGrace(s.srv.ReadHeaderTimeout), s.logger, s.handler.metrics), make(chan struct{})
	s.srv.ConnState = s.ln.state
	go func(done chan struct{}, ln net.Listener) {
		defer close(done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("api server stopped", "error", err)
		}
	}(s.serving, s.ln)
	pruneCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stop, s.pruned = stop, make(chan struct{})
	go s.pruneLoop(pruneCtx, s.pruned)
	s.logger.Info("api server listening", "addr", ln.Addr().String(), "max_connections", s.maxConns)
	return nil
}

func (s *Server) pruneLoop(ctx context.Context, done chan struct{}) {
	defer close(done)
	if s.prune < 0 {
		return
	}
	t := time.NewTicker(s.prune)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := s.handler.Prune(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			s.logger.Warn("prune idempotency records", "error", err)
		case n > 0:
			s.logger.Info("pruned idempotency records", "records", n, "retention", Retention)
		}
	}
}

// Addr returns the bound address, such as "127.0.0.1:8080", or "" before
// Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Stop stops accepting connections and waits for in-flight requests to
// finish, or for ctx to end, whichever comes first; then it closes the
// remaining connections. It returns ctx's error if requests were cut off,
// and nil if the server was never started.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	serving, stop, pruned := s.serving, s.stop, s.pruned
	s.mu.Unlock()
	if serving == nil {
		return nil
	}
	stop()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(fmt.Errorf("shut down api server: %w", err), s.srv.Close())
	}
	<-serving
	<-pruned
	s.logger.Info("api server stopped")
	return err
}
