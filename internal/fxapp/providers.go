package fxapp

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	stripeclient "github.com/stripe/stripe-go/v76/client"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/notify"
)

const providerTimeout = config.ProviderTimeout

// ProvidersModule provides the external providers the activities call, a
// Stripe client and the SendGrid receipt sender, each also in the "providers"
// group the worker hands its steps (pipeline.Provider). On start the sender
// probes the Email Activity API in the background and warns when the key
// cannot use it. A new provider is its constructor (settings from
// *config.Config, HTTP client from ProviderHTTP) and one provider[T]() line.
var ProvidersModule = fx.Module("providers",
	fx.Provide(newProviderHTTP, newStripe, newSender),
	provider[*stripeclient.API](),
	provider[*notify.Sender](),
)

// provider puts the graph's T into the "providers" group.
func provider[T any]() fx.Option {
	return fx.Provide(fx.Annotate(func(c T) any { return c }, fx.ResultTags(`group:"providers"`)))
}

// ProviderHTTP returns a new HTTP client for a provider's API client: each
// request times out after config.ProviderTimeout and, when the app has a
// trace.TracerProvider, gets a span. Each client has its own connection
// pool, which keeps as many idle connections to its provider as the
// worker runs activities (providerTransport).
type ProviderHTTP func() *http.Client

type providerHTTPIn struct {
	fx.In
	Worker config.WorkerTuning
	Tracer trace.TracerProvider `optional:"true"`
}

func newProviderHTTP(in providerHTTPIn) ProviderHTTP {
	return func() *http.Client {
		c := &http.Client{Timeout: providerTimeout, Transport: providerTransport(in.Worker.MaxConcurrentActivities)}
		return tracedClient(c, in.Tracer)
	}
}

// providerTransport is http.DefaultTransport's settings with room for slots
// idle connections to one host (DefaultMaxActivities when slots is not
// positive). http.DefaultTransport keeps two: with more calls in flight
// than that, most calls to a provider would dial it again, and shake hands
// for TLS again, instead of reusing a connection.
func providerTransport(slots int) *http.Transport {
	if slots <= 0 {
		slots = config.DefaultMaxActivities
	}
	t := &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true}
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		t = dt.Clone()
	}
	t.MaxIdleConnsPerHost = slots
	t.MaxIdleConns = max(t.MaxIdleConns, slots)
	return t
}

type stripeIn struct {
	fx.In
	Config config.Stripe
	HTTP   ProviderHTTP
}

func newStripe(in stripeIn) (*stripeclient.API, error) {
	return stripestep.NewClient(string(in.Config.SecretKey), in.Config.APIBase,
		in.HTTP())
}

type senderIn struct {
	fx.In
	Lifecycle fx.Lifecycle
	Effects   *effects.Client
	Pool      *pgxpool.Pool
	SendGrid  config.SendGrid
	Receipt   config.Receipt
	Logger    *slog.Logger
	HTTP      ProviderHTTP
}

func newSender(in senderIn) (*notify.Sender, error) {
	lc, fxc, pool, sg, rc := in.Lifecycle, in.Effects, in.Pool, in.SendGrid, in.Receipt
	logger := in.Logger.With("component", "notify")
	s, err := notify.NewSender(fxc, pool, &notify.SenderOpts{
		APIKey:         string(sg.APIKey),
		BaseURL:        sg.APIBase,
		From:           rc.From,
		CollapseWindow: rc.CollapseWindow,
		Policies:       map[string]notify.Policy{ordersteps.ReceiptTemplate: notify.Policy(rc.Policy)},
		HTTPClient:     in.HTTP(),
		LookupLag:      sg.LookupLag,
		LookupGiveUp:   sg.LookupGiveUp,
		Logger:         logger,
	})
	if err != nil {
		return nil, err
	}
	lc.Append(checkLookupHook(s, logger))
	return s, nil
}

// checkLookupHook asks SendGrid at start, in the background, whether its
// Email Activity API can be used, and warns when it cannot. The check ends
// with the app (a stop, or a start that failed later): it never logs after
// the app is gone.
func checkLookupHook(s *notify.Sender, logger *slog.Logger) fx.Hook {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	return fx.Hook{
		OnStart: func(context.Context) error {
			go func() {
				defer close(done)
				cctx, ccancel := context.WithTimeout(ctx, providerTimeout)
				defer ccancel()
				if err := s.CheckLookup(cctx); err != nil && ctx.Err() == nil {
					logger.Warn("SendGrid's Email Activity API cannot be used; lost answers to receipt sends will wait for it and then follow RECEIPT_POLICY", "error", err)
				}
			}()
			return nil
		},
		OnStop: func(context.Context) error {
			cancel()
			<-done
			return nil
		},
	}
}
