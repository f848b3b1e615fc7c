package config

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"github.com/BurntSushi/toml"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/contrib/envconfig"
	grpcgzip "google.golang.org/grpc/encoding/gzip"
)

// The Temporal connection is configured the SDK's way (contrib/envconfig):
// a TOML config file (TEMPORAL_CONFIG_FILE, default
// $XDG_CONFIG_HOME/temporalio/temporal.toml) whose profile (TEMPORAL_PROFILE,
// default "default") the standard variables override: TEMPORAL_ADDRESS,
// TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS,
// TEMPORAL_TLS_CLIENT_CERT_PATH (or _DATA), TEMPORAL_TLS_CLIENT_KEY_PATH
// (or _DATA), TEMPORAL_TLS_SERVER_CA_CERT_PATH (or _DATA),
// TEMPORAL_TLS_SERVER_NAME, TEMPORAL_TLS_DISABLE_HOST_VERIFICATION,
// TEMPORAL_CLIENT_AUTHORITY and TEMPORAL_GRPC_META_*. keyed's flags
// override the address and namespace. A blank variable counts as unset,
// as keyed's other variables do.

// ClientOptions returns the Temporal SDK client options of t: its address,
// namespace and gRPC compression, and the profile's TLS, client
// certificate, API key and gRPC headers. It reads the certificate files again, so an error (a file
// gone or changed since Load checked it) names the file, never a secret.
func (t Temporal) ClientOptions() (client.Options, error) {
	opts, err := t.conn.ToClientOptions(envconfig.ToClientOptionsRequest{})
	if err != nil {
		return client.Options{}, fmt.Errorf("temporal connection settings: %w", err)
	}
	opts.HostPort = t.Address
	opts.Namespace = t.Namespace
	if t.Compression == CompressionNone {
		opts.ConnectionOptions.GrpcCompression = &client.GrpcCompressionNone{}
	}
	return opts, nil
}

// UseFastGzip makes gRPC's gzip compressor, which the Temporal SDK uses
// for every call unless TEMPORAL_GRPC_COMPRESSION is none, compress at
// gzip.BestSpeed: the default level clears 640 KiB of match tables before
// each message, which made it about a tenth of a loaded worker's CPU; the
// fastest level takes a third to a half of its time for a worker's
// messages, which come out about as small. The setting is the process's,
// so main calls it from init, before any connection is made.
func UseFastGzip() {
	if err := grpcgzip.SetLevel(gzip.BestSpeed); err != nil {
		panic(err) // BestSpeed is a valid level
	}
}

// TLS reports how the connection is secured: "off", "tls" (the server is
// verified), or "mtls" (and a client certificate is presented).
func (t Temporal) TLS() string {
	c := t.conn.TLS
	switch {
	case c != nil && c.Disabled, c == nil && t.conn.APIKey == "":
		return "off"
	case c != nil && (c.ClientCertPath != "" || len(c.ClientCertData) > 0):
		return "mtls"
	}
	return "tls"
}

// HasAPIKey reports whether an API key (TEMPORAL_API_KEY) is set.
func (t Temporal) HasAPIKey() bool { return t.conn.APIKey != "" }

// LogValue implements slog.LogValuer: the settings without their secrets.
func (t Temporal) LogValue() slog.Value { return slog.GroupValue(t.logAttrs()...) }

// String returns the settings without their secrets, one "name=value" each.
func (t Temporal) String() string {
	var b strings.Builder
	for i, a := range t.logAttrs() {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s", a.Key, a.Value)
	}
	return b.String()
}

// GoString is String, so that %#v of a Config shows no secret either.
func (t Temporal) GoString() string { return "config.Temporal{" + t.String() + "}" }

func (t Temporal) logAttrs() []slog.Attr {
	return append([]slog.Attr{
		slog.String("temporal_address", t.Address),
		slog.String("temporal_namespace", t.Namespace),
		slog.String("task_queue", t.TaskQueue),
		slog.String("temporal_grpc_compression", t.Compression),
	}, t.connAttrs()...)
}

// connAttrs describes the connection's security, secrets redacted.
func (t Temporal) connAttrs() []slog.Attr {
	attrs := []slog.Attr{slog.String("temporal_tls", t.TLS())}
	if c := t.conn.TLS; c != nil && !c.Disabled {
		if c.ServerName != "" {
			attrs = append(attrs, slog.String("temporal_tls_server_name", c.ServerName))
		}
		if c.DisableHostVerification {
			attrs = append(attrs, slog.Bool("temporal_tls_verify", false))
		}
	}
	if t.HasAPIKey() {
		attrs = append(attrs, slog.String("temporal_api_key", "(redacted)"))
	}
	if t.Profile != "" {
		attrs = append(attrs, slog.String("temporal_profile", t.Profile))
	}
	return attrs
}

// loadTemporal reads the Temporal connection: the config file's profile
// under the TEMPORAL_* variables. The table's defaults fill what neither
// sets.
func (l *Loader) loadTemporal() {
	t := &l.cfg.Temporal
	env := envLookup(l.lookup)
	t.Profile, _ = env.LookupEnv("TEMPORAL_PROFILE")
	prof, err := envconfig.LoadClientConfigProfile(envconfig.LoadClientConfigProfileOptions{EnvLookup: env})
	if err != nil {
		l.temporalFileProblem(env, err)
		// Still honour the variables, so that Load reports their problems too.
		prof = envconfig.ClientConfigProfile{}
		_ = prof.ApplyEnvVars(env) // never fails
	}
	t.conn = prof
	t.Address, t.Namespace = prof.Address, prof.Namespace
}

// temporalFileProblem reports a config file that cannot be read or parsed,
// or a missing profile, without quoting the file's contents.
func (l *Loader) temporalFileProblem(env envLookup, err error) {
	file, ok := env.LookupEnv("TEMPORAL_CONFIG_FILE")
	if !ok {
		file = envconfig.DefaultConfigFilePath()
	}
	var perr toml.ParseError
	var pathErr *fs.PathError
	switch {
	case errors.As(err, &perr):
		l.problem("TEMPORAL_CONFIG_FILE", "%s is not valid TOML (line %d)", file, perr.Position.Line)
	case errors.As(err, &pathErr):
		l.problem("TEMPORAL_CONFIG_FILE", "cannot read %s: %v", file, pathErr.Err)
	case strings.Contains(err.Error(), "unable to find profile"):
		l.problem("TEMPORAL_PROFILE", "no profile %q in %s", l.cfg.Temporal.Profile, file)
	default:
		l.problem("TEMPORAL_CONFIG_FILE", "%s is not a Temporal config file", file)
	}
}

// checkTemporal reports the connection settings that would fail the
// client: unreadable files, files without the PEM they should hold, a
// certificate without its key, a key that does not match.
func (l *Loader) checkTemporal(t Temporal, add func(name, format string, args ...any)) {
	for _, name := range []string{"TEMPORAL_TLS", "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION"} {
		if v, ok := envLookup(l.lookup).LookupEnv(name); ok {
			switch strings.ToLower(v) {
			case "1", "0", "true", "false":
			default:
				add(name, "%q is not true or false (or 1, 0)", quote(v))
			}
		}
	}
	c := t.conn.TLS
	if c == nil || c.Disabled {
		return
	}
	cert, certName, certOK := l.readPEM(add, "CLIENT_CERT", c.ClientCertPath, c.ClientCertData)
	key, keyName, keyOK := l.readPEM(add, "CLIENT_KEY", c.ClientKeyPath, c.ClientKeyData)
	switch {
	case !certOK || !keyOK, cert == nil && key == nil:
	case key == nil:
		add(keyName, "required with %s (the client certificate's private key)", certName)
	case cert == nil:
		add(certName, "required with %s (the client certificate)", keyName)
	case !hasPEM(cert, "CERTIFICATE"):
		add(certName, "holds no PEM certificate")
	case !hasPEM(key, "PRIVATE KEY"):
		add(keyName, "holds no PEM private key")
	default:
		if _, err := tls.X509KeyPair(cert, key); err != nil {
			// crypto/tls's messages never quote the key.
			add(keyName, "does not fit the client certificate in %s: %v", certName, err)
		}
	}
	if ca, caName, _ := l.readPEM(add, "SERVER_CA_CERT", c.ServerCACertPath, c.ServerCACertData); ca != nil {
		if !x509.NewCertPool().AppendCertsFromPEM(ca) {
			add(caName, "holds no PEM certificate")
		}
	}
}

// readPEM returns the bytes of the TEMPORAL_TLS_<what>_PATH file or
// TEMPORAL_TLS_<what>_DATA (nil when neither is set), the setting's name
// for messages, and false when a problem was added: both set, or a file
// that cannot be read.
func (l *Loader) readPEM(add func(string, string, ...any), what, path string, data []byte) ([]byte, string, bool) {
	pathName := l.temporalSource("TEMPORAL_TLS_"+what+"_PATH", strings.ToLower(what)+"_path", path != "")
	dataName := l.temporalSource("TEMPORAL_TLS_"+what+"_DATA", strings.ToLower(what)+"_data", len(data) > 0)
	switch {
	case path != "" && len(data) > 0:
		add(pathName, "set either it or %s, not both", dataName)
		return nil, pathName, false
	case len(data) > 0:
		return data, dataName, true
	case path == "":
		return nil, pathName, true
	}
	b, err := os.ReadFile(path)
	if err != nil {
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) {
			err = pathErr.Err
		}
		add(pathName, "cannot read %s: %v", path, err)
		return nil, pathName, false
	}
	return b, pathName, true
}

// temporalSource names where a TLS setting came from: its variable, unless
// only the config file's profile sets it (inFile), then its key there.
func (l *Loader) temporalSource(env, key string, inFile bool) string {
	if _, ok := envLookup(l.lookup).LookupEnv(env); ok || !inFile {
		return env
	}
	prof := l.cfg.Temporal.Profile
	if prof == "" {
		prof = envconfig.DefaultConfigFileProfile
	}
	return fmt.Sprintf("TEMPORAL_CONFIG_FILE [profile.%s.tls] %s", prof, key)
}

func hasPEM(b []byte, typeSuffix string) bool {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return false
		}
		if strings.HasSuffix(block.Type, typeSuffix) {
			return true
		}
		b = bytes.TrimSpace(b)
	}
}

// envLookup adapts the Loader's lookup to envconfig: values are trimmed,
// and a blank one counts as unset.
type envLookup func(string) (string, bool)

// LookupEnv returns the trimmed value of name, and whether it is set and
// not blank.
func (e envLookup) LookupEnv(name string) (string, bool) {
	v, ok := e(name)
	v = strings.TrimSpace(v)
	return v, ok && v != ""
}

// Environ lists the process's TEMPORAL_GRPC_META_* variables that the
// lookup also sees, as name=value: envconfig reads gRPC headers from it.
func (e envLookup) Environ() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "TEMPORAL_GRPC_META_") {
			continue
		}
		if v, ok := e(name); ok {
			out = append(out, name+"="+v)
		}
	}
	return out
}
