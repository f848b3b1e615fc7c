package deploy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// secretFileStandIns points env's values that name a file under a mounted
// Secret volume of c at stand-in files (a self-signed certificate as
// tls.crt, ca.crt and its key as tls.key), since keyed's configuration
// loader reads the TEMPORAL_TLS_* files it is given.
func secretFileStandIns(t *testing.T, spec *corev1.PodSpec, c corev1.Container, env map[string]string) {
	t.Helper()
	secretVolumes := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			secretVolumes[v.Name] = true
		}
	}
	for _, m := range c.VolumeMounts {
		if !secretVolumes[m.Name] {
			continue
		}
		dir := standInTLSDir(t)
		for k, v := range env {
			if rest, ok := strings.CutPrefix(v, strings.TrimSuffix(m.MountPath, "/")+"/"); ok {
				env[k] = filepath.Join(dir, rest)
			}
		}
	}
}

func standInTLSDir(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "stand-in"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.crt"), cert, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ca.crt"), cert, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	return dir
}
