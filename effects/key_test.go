package effects_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

func TestNewKey(t *testing.T) {
	t.Parallel()
	k, err := effects.NewKey("acme", "order", "9f3a", "charge")
	require.NoError(t, err)
	require.Equal(t, "acme:order:9f3a:charge", k.String())
	require.Equal(t, "acme", k.Tenant())
	require.Equal(t, []string{"order", "9f3a", "charge"}, k.Parts())

	child, err := effects.MustKey("acme", "order", "9f3a").With("receipt")
	require.NoError(t, err)
	require.Equal(t, "acme:order:9f3a:receipt", child.String())

	for name, tc := range map[string]struct {
		tenant string
		parts  []string
		want   string
	}{
		"empty tenant":    {"", []string{"a"}, "tenant"},
		"no parts":        {"acme", nil, "at least one part"},
		"empty part":      {"acme", []string{"order", ""}, "part 2"},
		"separator":       {"acme", []string{"or:der"}, "separator"},
		"space":           {"acme", []string{"or der"}, "printable ASCII"},
		"newline":         {"acme", []string{"x\n"}, "0x0a"},
		"non-ascii":       {"acme", []string{"caf\u00e9"}, "printable ASCII"},
		"tenant with sep": {"ac:me", []string{"x"}, "tenant"},
		"too long":        {"acme", []string{strings.Repeat("x", 251)}, "longer than the 255"},
	} {
		_, err := effects.NewKey(tc.tenant, tc.parts...)
		require.ErrorIs(t, err, effects.ErrInvalidKey, name)
		require.ErrorContains(t, err, tc.want, name)
	}
	_, err = effects.NewKey("acme", strings.Repeat("x", 250))
	require.NoError(t, err, "exactly 255 bytes is allowed")
}

func TestParseKeyRoundTrip(t *testing.T) {
	t.Parallel()
	k, err := effects.ParseKey("acme:order:9f3a:charge")
	require.NoError(t, err)
	require.Equal(t, effects.MustKey("acme", "order", "9f3a", "charge"), k)
	for _, bad := range []string{"", "acme", "acme:", ":x", "acme::x", "a:b\x00"} {
		_, err := effects.ParseKey(bad)
		require.ErrorIs(t, err, effects.ErrInvalidKey, "%q", bad)
	}
	var z effects.Key
	require.True(t, z.IsZero())
	_, err = z.With("x")
	require.ErrorIs(t, err, effects.ErrInvalidKey)
}

// FuzzParseKey checks that every string either fails with ErrInvalidKey or
// parses into a key whose string form is itself, fits Stripe's limit, and is
// safe to send as an HTTP header.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"acme:order:9f3a:charge", "a:b", "", ":", "a::b", "a:b:", "t:" + strings.Repeat("x", 253), "a:b\x7f", "a:\u00e9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := effects.ParseKey(s)
		if err != nil {
			require.ErrorIs(t, err, effects.ErrInvalidKey)
			require.True(t, k.IsZero())
			return
		}
		require.Equal(t, s, k.String())
		require.LessOrEqual(t, len(s), effects.MaxKeyLen)
		for i := 0; i < len(s); i++ {
			require.True(t, s[i] > ' ' && s[i] < 0x7f, "byte %d of %q", i, s)
		}
		again, err := effects.NewKey(k.Tenant(), k.Parts()...)
		require.NoError(t, err)
		require.Equal(t, k, again)
	})
}
