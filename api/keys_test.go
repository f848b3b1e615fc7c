package api_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
)

func TestParseKeys(t *testing.T) {
	t.Parallel()
	k, err := api.ParseKeys(" acme=sk_acme_0123456789abcdef , globex=sk_globex_0123456789abcdef,\nacme=sk_acme_rotated_0123456789")
	require.NoError(t, err)
	require.Equal(t, []string{"acme", "globex"}, k.Tenants())
	for key, want := range map[string]string{
		"sk_acme_0123456789abcdef":       "acme",
		"sk_acme_rotated_0123456789":     "acme",
		"sk_globex_0123456789abcdef":     "globex",
		"sk_globex_0123456789abcdeF":     "",
		"sk_acme_0123456789abcde":        "",
		"sk_acme_0123456789abcdef ":      "",
		"":                               "",
		"acme=sk_acme_0123456789abcdef":  "",
		"sk_acme_0123456789abcdefsuffix": "",
	} {
		got, ok := k.Tenant(key)
		require.Equal(t, want != "", ok, "%q", key)
		require.Equal(t, want, got, "%q", key)
	}
	require.NotContains(t, k.String(), "sk_", "String never shows a key")

	// The file format: one entry a line, comments and blanks ignored.
	k, err = api.ParseKeys("# production keys\n\nacme=sk_acme_0123456789abcdef\n  # rotated 2026-06\nacme=sk_acme_0123456789abcdeg\n")
	require.NoError(t, err)
	require.Equal(t, []string{"acme"}, k.Tenants())

	secret := "sk_secret_0123456789abcdef"
	for _, bad := range []string{
		"acme",
		"acme=",
		"=" + secret,
		"ac me=" + secret,
		"ac:me=" + secret,
		"acme=short",
		"acme=sk_with space_0123456789",
		"acme=" + secret + ",globex=" + secret,
		strings.Repeat("t", 172) + "=" + secret, // no room left for an Idempotency-Key's effect key
		"acme=" + secret + ";globex=sk_globex_0123456789abcdef", // entries are separated by commas, not ";"
		`acme="` + secret + `"`,                                 // quotes would be part of the key
		"acme='" + secret + "'",
		"acme=" + secret + "=x",                              // padding only at the end
		"acme=" + secret + ",ACME=sk_other_0123456789abcdef", // two spellings of one tenant
	} {
		_, err := api.ParseKeys(bad)
		require.ErrorIs(t, err, api.ErrBadKeys, "%q", bad)
		require.NotContains(t, err.Error(), "0123456789", "errors never show a key: %v", err)
	}
	// A bearer token's whole alphabet, base64 padding included.
	k, err = api.ParseKeys("acme=c2tfYWNtZV8wMTIzNDU2Nzg5-._~+/==")
	require.NoError(t, err)
	tenant, ok := k.Tenant("c2tfYWNtZV8wMTIzNDU2Nzg5-._~+/==")
	require.True(t, ok)
	require.Equal(t, "acme", tenant)
	_, err = api.ParseKeys(" # nothing\n ,, ")
	require.ErrorIs(t, err, api.ErrNoKeys)
}

// An Idempotency-Key becomes an effect key of its tenant: itself when it
// fits as a key part, else its SHA-256, so every accepted key maps to one
// effect key, and no two keys to the same.
func TestRequestKey(t *testing.T) {
	t.Parallel()
	longest := strings.Repeat("t", api.MaxTenantLen)
	require.Equal(t, 171, api.MaxTenantLen)
	_, err := api.ParseKeys(longest + "=sk_secret_0123456789abcdef")
	require.NoError(t, err)
	seen := map[string]string{}
	for _, tc := range []struct{ tenant, idem, want string }{
		{"acme", "5c1f0a3e-checkout", "acme:idempotency:5c1f0a3e-checkout"},
		{"acme", "a:b", "acme:idempotency-sha256:"},
		{"acme", "idempotency-sha256:x", "acme:idempotency-sha256:"},
		{"acme", strings.Repeat("k", 255), "acme:idempotency-sha256:"},
		{"acme", strings.Repeat("k", 238), "acme:idempotency:kkk"},
		{"globex", "5c1f0a3e-checkout", "globex:idempotency:5c1f0a3e-checkout"},
		{longest, strings.Repeat("~", 255), longest + ":idempotency-sha256:"},
	} {
		k, err := api.RequestKeyForTest(tc.tenant, tc.idem)
		require.NoError(t, err, "%q", tc.idem)
		require.Equal(t, tc.tenant, k.Tenant())
		require.True(t, strings.HasPrefix(k.String(), tc.want), "%s", k)
		require.NotContains(t, seen, k.String(), "%q and %q", seen[k.String()], tc.idem)
		seen[k.String()] = tc.idem
	}
}

func TestKeysFrom(t *testing.T) {
	t.Parallel()
	k, err := api.KeysFrom("acme=sk_acme_0123456789abcdef,globex=sk_globex_0123456789abcdef", "")
	require.NoError(t, err)
	require.Equal(t, []string{"acme", "globex"}, k.Tenants())

	path := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(path, []byte("acme=sk_acme_0123456789abcdef\n"), 0o600))
	k, err = api.KeysFrom(" ", path)
	require.NoError(t, err)
	tenant, ok := k.Tenant("sk_acme_0123456789abcdef")
	require.True(t, ok)
	require.Equal(t, "acme", tenant)

	_, err = api.KeysFrom("", "")
	require.ErrorIs(t, err, api.ErrNoKeys)
	require.Contains(t, err.Error(), api.EnvKeys)
	_, err = api.KeysFrom("acme=sk_acme_0123456789abcdef", path)
	require.ErrorIs(t, err, api.ErrBadKeys)
	_, err = api.KeysFrom("", filepath.Join(t.TempDir(), "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = api.KeysFrom("acme=sk_short", "")
	require.ErrorIs(t, err, api.ErrBadKeys)
	require.False(t, strings.Contains(err.Error(), "sk_short"))
}
