package config

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Redacted returns the database URL without its password, as
// "postgres://user@host:port/db", for logs and messages.
func (d Database) Redacted() string {
	cfg, err := pgx.ParseConfig(d.URL)
	if err != nil {
		return "(unparseable DATABASE_URL)"
	}
	s := fmt.Sprintf("postgres://%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
	if sp := cfg.RuntimeParams["search_path"]; sp != "" {
		s += "?search_path=" + sp
	}
	return s
}

// redactKey shows what kind of key is set, never the key: "sk_test_…",
// "rk_live_…", "SG.…", "(unset)".
func redactKey(key string) string {
	if key == "" {
		return "(unset)"
	}
	for _, p := range []string{"sk_test_", "sk_live_", "rk_test_", "rk_live_", "sk_", "rk_", "SG."} {
		if strings.HasPrefix(key, p) {
			return p + "…(redacted)"
		}
	}
	return "(redacted)"
}

// LogValue implements slog.LogValuer: the configuration with its secrets
// redacted.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("role", c.Role.String()),
		slog.String("database", c.Database.Redacted()),
		slog.Bool("migrate_on_start", c.Database.Migrate),
	}
	attrs = append(attrs, c.Temporal.logAttrs()...)
	attrs = append(attrs, slog.String("log_level", c.LogLevel.String()))
	if c.Role == Worker {
		attrs = append(attrs,
			slog.String("stripe_secret_key", redactKey(c.Stripe.SecretKey)),
			slog.String("stripe_api_base", c.Stripe.APIBase),
			slog.String("sendgrid_api_key", redactKey(c.SendGrid.APIKey)),
			slog.String("sendgrid_api_base", c.SendGrid.APIBase),
			slog.String("receipt_from", c.Receipt.From),
			slog.String("receipt_policy", c.Receipt.Policy),
			slog.Duration("collapse_window", c.Receipt.CollapseWindow),
			slog.String("metrics_addr", c.Metrics.Addr),
			slog.Duration("stop_timeout", c.Worker.StopTimeout),
			slog.Int("max_activities", c.Worker.MaxConcurrentActivities),
		)
	}
	return slog.GroupValue(attrs...)
}

// String returns the configuration with its secrets redacted, one
// "name=value" per setting.
func (c Config) String() string {
	var b strings.Builder
	for i, a := range c.LogValue().Group() {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s", a.Key, a.Value)
	}
	return b.String()
}

// GoString is String, so that %#v cannot print a secret either.
func (c Config) GoString() string { return "config.Config{" + c.String() + "}" }

// String returns the database settings with the password redacted.
func (d Database) String() string {
	return fmt.Sprintf("{url=%s migrate=%t}", d.Redacted(), d.Migrate)
}

// String returns the Stripe settings with the key redacted.
func (s Stripe) String() string {
	return fmt.Sprintf("{secret_key=%s api_base=%s}", redactKey(s.SecretKey), s.APIBase)
}

// String returns the SendGrid settings with the key redacted.
func (s SendGrid) String() string {
	return fmt.Sprintf("{api_key=%s api_base=%s}", redactKey(s.APIKey), s.APIBase)
}
