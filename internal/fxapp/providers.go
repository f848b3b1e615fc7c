package fxapp

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	stripeclient "github.com/stripe/stripe-go/v76/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/notify"
)

// providerTimeout bounds one HTTP request to Stripe or SendGrid. An
// ambiguous timeout is retried with the same idempotency key, so a short
// bound costs nothing but a retry.
const providerTimeout = 30 * time.Second

// ProvidersModule provides the external providers the activities call: a
// Stripe API client (STRIPE_SECRET_KEY, STRIPE_API_BASE) and the receipt
// sender over SendGrid (SENDGRID_API_KEY, SENDGRID_API_BASE, RECEIPT_FROM,
// RECEIPT_POLICY, COLLAPSE_WINDOW).
var ProvidersModule = fx.Module("providers",
	fx.Provide(newStripe, newSender),
)

func newStripe(cfg config.Stripe) (*stripeclient.API, error) {
	return activities.NewStripeClient(cfg.SecretKey, cfg.APIBase, &http.Client{Timeout: providerTimeout})
}

func newSender(fxc *effects.Client, pool *pgxpool.Pool, sg config.SendGrid, rc config.Receipt, logger *slog.Logger) (*notify.Sender, error) {
	return notify.NewSender(fxc, pool, &notify.SenderOpts{
		APIKey:         sg.APIKey,
		BaseURL:        sg.APIBase,
		From:           rc.From,
		CollapseWindow: rc.CollapseWindow,
		Policies:       map[string]notify.Policy{activities.ReceiptTemplate: notify.Policy(rc.Policy)},
		HTTPClient:     &http.Client{Timeout: providerTimeout},
		Logger:         logger.With("component", "notify"),
	})
}
