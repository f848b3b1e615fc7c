package fxapp

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	stripeclient "github.com/stripe/stripe-go/v76/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/notify"
)

const providerTimeout = config.ProviderTimeout

// ProvidersModule provides the external providers the activities call: a
// Stripe API client (STRIPE_SECRET_KEY, STRIPE_API_BASE) and the receipt
// sender over SendGrid (SENDGRID_API_KEY, SENDGRID_API_BASE,
// SENDGRID_LOOKUP_LAG, SENDGRID_LOOKUP_GIVE_UP, RECEIPT_FROM, RECEIPT_POLICY,
// COLLAPSE_WINDOW). On start the sender probes SendGrid's Email Activity
// API in the background and logs a warning when the key cannot use it: lost
// answers could then not be settled from SendGrid's record.
var ProvidersModule = fx.Module("providers",
	fx.Provide(newStripe, newSender),
)

func newStripe(cfg config.Stripe) (*stripeclient.API, error) {
	return activities.NewStripeClient(cfg.SecretKey, cfg.APIBase, &http.Client{Timeout: providerTimeout})
}

func newSender(lc fx.Lifecycle, fxc *effects.Client, pool *pgxpool.Pool, sg config.SendGrid, rc config.Receipt, logger *slog.Logger) (*notify.Sender, error) {
	logger = logger.With("component", "notify")
	s, err := notify.NewSender(fxc, pool, &notify.SenderOpts{
		APIKey:         sg.APIKey,
		BaseURL:        sg.APIBase,
		From:           rc.From,
		CollapseWindow: rc.CollapseWindow,
		Policies:       map[string]notify.Policy{activities.ReceiptTemplate: notify.Policy(rc.Policy)},
		HTTPClient:     &http.Client{Timeout: providerTimeout},
		LookupLag:      sg.LookupLag,
		LookupGiveUp:   sg.LookupGiveUp,
		Logger:         logger,
	})
	if err != nil {
		return nil, err
	}
	lc.Append(fx.StartHook(func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), providerTimeout)
			defer cancel()
			if err := s.CheckLookup(ctx); err != nil {
				logger.Warn("SendGrid's Email Activity API cannot be used; lost answers to receipt sends will wait for it and then follow RECEIPT_POLICY", "error", err)
			}
		}()
	}))
	return s, nil
}
