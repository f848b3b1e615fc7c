package config_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/internal/config"
)

const temporalAPIKey = "tmprl-apikey-SECRETVALUE"

// certFiles writes a self-signed certificate and its key as PEM files and
// returns their paths.
func certFiles(t *testing.T) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "keyed"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	certPath, keyPath = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certPath, keyPath
}

func TestTemporalPlainByDefault(t *testing.T) {
	t.Parallel()
	c, err := load(t, config.Starter, nil)
	require.NoError(t, err)
	require.Equal(t, "off", c.Temporal.TLS())
	opts, err := c.Temporal.ClientOptions()
	require.NoError(t, err)
	require.Equal(t, config.DefaultTemporalAddress, opts.HostPort)
	require.Equal(t, config.DefaultTemporalNamespace, opts.Namespace)
	require.Nil(t, opts.ConnectionOptions.TLS)
	require.Nil(t, opts.Credentials)
	require.Nil(t, opts.ConnectionOptions.GrpcCompression, "the SDK's default: gzip")
}

func TestTemporalCompressionOff(t *testing.T) {
	t.Parallel()
	m := workerEnv()
	m["TEMPORAL_GRPC_COMPRESSION"] = config.CompressionNone
	c, err := load(t, config.Worker, m)
	require.NoError(t, err)
	opts, err := c.Temporal.ClientOptions()
	require.NoError(t, err)
	require.IsType(t, &client.GrpcCompressionNone{}, opts.ConnectionOptions.GrpcCompression)
	require.Contains(t, c.Temporal.String(), "temporal_grpc_compression=none")

	m["TEMPORAL_GRPC_COMPRESSION"] = "zstd"
	_, err = load(t, config.Worker, m)
	require.ErrorContains(t, err, "TEMPORAL_GRPC_COMPRESSION")
}

func TestTemporalMutualTLS(t *testing.T) {
	t.Parallel()
	cert, key := certFiles(t)
	m := workerEnv()
	m["TEMPORAL_ADDRESS"] = "orders.a1b2c.tmprl.cloud:7233"
	m["TEMPORAL_NAMESPACE"] = "orders.a1b2c"
	m["TEMPORAL_TLS_CLIENT_CERT_PATH"] = cert
	m["TEMPORAL_TLS_CLIENT_KEY_PATH"] = " " + key + "\n" // trimmed, as keyed's other variables
	m["TEMPORAL_TLS_SERVER_CA_CERT_PATH"] = cert
	m["TEMPORAL_TLS_SERVER_NAME"] = "orders.a1b2c.tmprl.cloud"
	m["TEMPORAL_TLS_DISABLE_HOST_VERIFICATION"] = "0"
	c, err := load(t, config.Worker, m)
	require.NoError(t, err)
	require.Equal(t, "mtls", c.Temporal.TLS())
	opts, err := c.Temporal.ClientOptions()
	require.NoError(t, err)
	require.Equal(t, "orders.a1b2c.tmprl.cloud:7233", opts.HostPort)
	require.Equal(t, "orders.a1b2c", opts.Namespace)
	require.NotNil(t, opts.ConnectionOptions.TLS)
	require.Len(t, opts.ConnectionOptions.TLS.Certificates, 1)
	require.NotNil(t, opts.ConnectionOptions.TLS.RootCAs)
	require.Equal(t, "orders.a1b2c.tmprl.cloud", opts.ConnectionOptions.TLS.ServerName)
	require.Contains(t, c.String(), "temporal_tls=mtls temporal_tls_server_name=orders.a1b2c.tmprl.cloud")
	require.False(t, opts.ConnectionOptions.TLS.InsecureSkipVerify)

	m["TEMPORAL_TLS_DISABLE_HOST_VERIFICATION"] = "true"
	c, err = load(t, config.Worker, m)
	require.NoError(t, err)
	require.Contains(t, c.String(), "temporal_tls_verify=false", "an unverified connection shows in the log")
}

func TestTemporalAPIKeyIsASecret(t *testing.T) {
	t.Parallel()
	m := workerEnv()
	m["TEMPORAL_API_KEY"] = temporalAPIKey
	c, err := load(t, config.Worker, m)
	require.NoError(t, err)
	require.Equal(t, "tls", c.Temporal.TLS(), "an API key turns TLS on")
	require.True(t, c.Temporal.HasAPIKey())
	opts, err := c.Temporal.ClientOptions()
	require.NoError(t, err)
	require.NotNil(t, opts.Credentials, "the key reaches the SDK")
	require.NotNil(t, opts.ConnectionOptions.TLS)

	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("config", "config", c, "temporal", c.Temporal)
	for _, s := range []string{
		c.String(), fmt.Sprint(c), fmt.Sprintf("%+v", *c), fmt.Sprintf("%#v", *c), fmt.Sprintf("%#v", c.Temporal),
		fmt.Sprint(c.Temporal), fmt.Sprintf("%+v", c.Temporal), logs.String(),
	} {
		require.NotContains(t, s, "SECRETVALUE")
	}
	require.Contains(t, c.String(), "temporal_api_key=(redacted)")

	m["TEMPORAL_TLS"] = "false"
	c, err = load(t, config.Worker, m)
	require.NoError(t, err)
	require.Equal(t, "off", c.Temporal.TLS(), "TEMPORAL_TLS=false wins, for a plain-text proxy")
}

func TestTemporalBadTLSSettingsAreListed(t *testing.T) {
	t.Parallel()
	cert, key := certFiles(t)
	otherCert, _ := certFiles(t)
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	secretKey, err := os.ReadFile(key)
	require.NoError(t, err)

	for name, tc := range map[string]struct {
		env  map[string]string
		want string
	}{
		"missing CA": {map[string]string{"TEMPORAL_TLS_SERVER_CA_CERT_PATH": filepath.Join(dir, "absent.crt")},
			"TEMPORAL_TLS_SERVER_CA_CERT_PATH: cannot read " + filepath.Join(dir, "absent.crt") + ": no such file or directory"},
		"CA not PEM": {map[string]string{"TEMPORAL_TLS_SERVER_CA_CERT_PATH": notPEM},
			"TEMPORAL_TLS_SERVER_CA_CERT_PATH: holds no PEM certificate"},
		"cert without key": {map[string]string{"TEMPORAL_TLS_CLIENT_CERT_PATH": cert},
			"TEMPORAL_TLS_CLIENT_KEY_PATH: required with TEMPORAL_TLS_CLIENT_CERT_PATH (the client certificate's private key)"},
		"key without cert": {map[string]string{"TEMPORAL_TLS_CLIENT_KEY_PATH": key},
			"TEMPORAL_TLS_CLIENT_CERT_PATH: required with TEMPORAL_TLS_CLIENT_KEY_PATH (the client certificate)"},
		"key is a certificate": {map[string]string{"TEMPORAL_TLS_CLIENT_CERT_PATH": cert, "TEMPORAL_TLS_CLIENT_KEY_PATH": cert},
			"TEMPORAL_TLS_CLIENT_KEY_PATH: holds no PEM private key"},
		"key of another certificate": {map[string]string{"TEMPORAL_TLS_CLIENT_CERT_PATH": otherCert, "TEMPORAL_TLS_CLIENT_KEY_PATH": key},
			"TEMPORAL_TLS_CLIENT_KEY_PATH: does not fit the client certificate in TEMPORAL_TLS_CLIENT_CERT_PATH: tls: private key does not match public key"},
		"path and data": {map[string]string{"TEMPORAL_TLS_CLIENT_KEY_PATH": key, "TEMPORAL_TLS_CLIENT_KEY_DATA": string(secretKey), "TEMPORAL_TLS_CLIENT_CERT_PATH": cert},
			"TEMPORAL_TLS_CLIENT_KEY_PATH: set either it or TEMPORAL_TLS_CLIENT_KEY_DATA, not both"},
		"TLS not a bool": {map[string]string{"TEMPORAL_TLS": "yes"},
			`TEMPORAL_TLS: "yes" is not true or false (or 1, 0)`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := workerEnv()
			m["LOG_LEVEL"] = "loud" // listed with the others
			for k, v := range tc.env {
				m[k] = v
			}
			_, err := load(t, config.Worker, m)
			var cerr *config.Error
			require.ErrorAs(t, err, &cerr)
			require.ErrorIs(t, err, config.ErrInvalid)
			require.Contains(t, cerr.Problems, tc.want)
			require.Len(t, cerr.Problems, 2, "%q", cerr.Problems)
			require.NotContains(t, err.Error(), string(secretKey[40:80]), "never the key")
		})
	}
}

func TestTemporalConfigFileProfiles(t *testing.T) {
	t.Parallel()
	cert, key := certFiles(t)
	file := filepath.Join(t.TempDir(), "temporal.toml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`
[profile.default]
address = "127.0.0.1:7233"

[profile.cloud]
address = "orders.a1b2c.tmprl.cloud:7233"
namespace = "orders.a1b2c"
[profile.cloud.tls]
client_cert_path = %q
client_key_path = %q
`, cert, key)), 0o600))
	m := workerEnv()
	m["TEMPORAL_CONFIG_FILE"] = file
	m["TEMPORAL_PROFILE"] = "cloud"
	c, err := load(t, config.Worker, m)
	require.NoError(t, err)
	require.Equal(t, "orders.a1b2c.tmprl.cloud:7233", c.Temporal.Address)
	require.Equal(t, "orders.a1b2c", c.Temporal.Namespace)
	require.Equal(t, "cloud", c.Temporal.Profile)
	require.Equal(t, "mtls", c.Temporal.TLS())
	require.Contains(t, c.String(), "temporal_profile=cloud")

	// The variables override the profile, and keyed's flags the variables.
	m["TEMPORAL_NAMESPACE"] = "orders-staging.a1b2c"
	m["TEMPORAL_ADDRESS"] = " " // blank counts as unset
	c, err = load(t, config.Worker, m, "--temporal-address", "staging.a1b2c.tmprl.cloud:7233")
	require.NoError(t, err)
	require.Equal(t, "staging.a1b2c.tmprl.cloud:7233", c.Temporal.Address)
	require.Equal(t, "orders-staging.a1b2c", c.Temporal.Namespace)

	// The profile's files are checked too, named by their key.
	require.NoError(t, os.Remove(key))
	_, err = load(t, config.Worker, m)
	require.ErrorContains(t, err, "TEMPORAL_CONFIG_FILE [profile.cloud.tls] client_key_path: cannot read "+key)

	m["TEMPORAL_PROFILE"] = "prod"
	_, err = load(t, config.Worker, m)
	require.ErrorContains(t, err, `TEMPORAL_PROFILE: no profile "prod" in `+file)
}

func TestTemporalConfigFileErrorsQuoteNothing(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "temporal.toml")
	require.NoError(t, os.WriteFile(file, []byte("[profile.default]\napi_key = \""+temporalAPIKey+"\nnamespace = 'x'\n"), 0o600))
	_, err := load(t, config.Starter, map[string]string{"TEMPORAL_CONFIG_FILE": file})
	require.ErrorContains(t, err, "TEMPORAL_CONFIG_FILE: "+file+" is not valid TOML (line 2)")
	require.NotContains(t, err.Error(), "SECRETVALUE")

	_, err = load(t, config.Starter, map[string]string{"TEMPORAL_CONFIG_FILE": t.TempDir()})
	require.ErrorContains(t, err, "TEMPORAL_CONFIG_FILE: cannot read ")
}

func TestTemporalOmitted(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l := config.NewLoader(config.Starter, env(map[string]string{
		"TEMPORAL_TLS_SERVER_CA_CERT_PATH": "/nonexistent/ca.crt", "TEMPORAL_PROFILE": "absent", "TEMPORAL_TLS": "maybe",
	}))
	l.Omit(config.TemporalFlags)
	l.BindFlags(fs)
	require.NoError(t, fs.Parse(nil))
	_, err := l.Load()
	require.NoError(t, err, "a program that never talks to Temporal ignores its settings")
}
