package config

import (
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"time"

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

// LogValue implements slog.LogValuer: the role, then each setting the
// program read that fills a field, named by its variable in lower case,
// secrets redacted, then the Temporal connection's security.
func (c Config) LogValue() slog.Value {
	uses := c.uses
	if uses == 0 {
		uses = c.Role.uses()
	}
	attrs := []slog.Attr{slog.String("role", c.Role.String())}
	temporal := false
	for i := range Settings {
		s := &Settings[i]
		if s.Field == "" || s.For&uses == 0 || c.omit[s.Group] {
			continue
		}
		attrs = append(attrs, s.logAttr(s.field(&c)))
		temporal = temporal || s.Group == TemporalFlags
	}
	if temporal {
		attrs = append(attrs, c.Temporal.connAttrs()...)
	}
	return slog.GroupValue(attrs...)
}

// logAttr returns f, the field of s, for the log.
func (s *Setting) logAttr(f reflect.Value) slog.Attr {
	key := strings.ToLower(s.Env)
	switch v := f.Interface().(type) {
	case string:
		if s.Redact != nil {
			return slog.String(key, s.Redact(v))
		}
		return slog.String(key, v)
	case time.Duration:
		return slog.Duration(key, v)
	case slog.Level:
		return slog.String(key, v.String())
	default:
		return slog.Any(key, v)
	}
}

// String returns the configuration with its secrets redacted, one
// "name=value" per setting.
func (c Config) String() string {
	var b strings.Builder
	for i, a := range c.LogValue().Group() {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s", a.Key, a.Value.Resolve())
	}
	return b.String()
}

// GoString is String, so that %#v cannot print a secret either.
func (c Config) GoString() string { return "config.Config{" + c.String() + "}" }

// String returns the database settings with the password redacted.
func (d Database) String() string {
	return fmt.Sprintf("{url=%s migrate=%t}", d.Redacted(), d.Migrate)
}

// GoString is String, so that %#v cannot print the password either.
func (d Database) GoString() string { return "config.Database" + d.String() }
