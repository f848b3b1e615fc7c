package idempotency

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseIdempotencyKey(t *testing.T) {
	t.Parallel()
	for value, want := range map[string]string{
		`8e03978e-40d5-43e8-bc93-6894a57f9324`:   `8e03978e-40d5-43e8-bc93-6894a57f9324`,
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`: `8e03978e-40d5-43e8-bc93-6894a57f9324`,
		`abc`:                                    `abc`,
		`"abc"`:                                  `abc`,
		` "abc" `:                                `abc`, // optional whitespace is not part of a field value
		"\t abc \t":                              `abc`,
		`"a\"b\\c"`:                              `a"b\c`,
		`a"b\c`:                                  `a"b\c`, // bare: taken as it is
		`"two words"`:                            `two words`,
		`"\"abc\""`:                              `"abc"`,
		`"` + strings.Repeat("k", 255) + `"`:     strings.Repeat("k", 255),
		`"` + strings.Repeat(`\\`, 255) + `"`:    strings.Repeat(`\`, 255), // the limit counts the unquoted key
	} {
		got, problem := ParseKey(value)
		require.Empty(t, problem, "%q", value)
		require.Equal(t, want, got, "%q", value)
	}
	for _, value := range []string{"", " ", `""`, `"`, `"abc`, `"abc\"`, `"a\bc"`, `"abc\`, `"abc";x=1`, `"abc";x`,
		`"abc" x`, `"abc","def"`, "\"a\x7fb\"", "\"a\nb\"", "\"\u00e9\"", `"` + strings.Repeat("k", 256) + `"`,
		strings.Repeat("k", 256), "two words", "k\x01", "cl\u00e9"} {
		got, problem := ParseKey(value)
		require.NotEmpty(t, problem, "%q accepted as %q", value, got)
		require.Empty(t, got, "%q", value)
	}
}

// FuzzParseIdempotencyKey checks, on any value, that an accepted key is 1
// to MaxKeyLen bytes of printable ASCII; that a bare value is
// its own key; and that an accepted key written as an RFC 8941 string
// parses back to itself, so the two forms always name one key.
func FuzzParseIdempotencyKey(f *testing.F) {
	for _, seed := range []string{`abc`, `"abc"`, `"a\"b\\c"`, `a"b`, `"abc";x=1`, `"abc`, `""`, `"a\qb"`,
		`"two words"`, "\"\u00e9\"", "k\x01", strings.Repeat("k", 256)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		key, problem := ParseKey(value)
		if problem != "" {
			require.Empty(t, key)
			return
		}
		require.NotEmpty(t, key)
		require.LessOrEqual(t, len(key), MaxKeyLen)
		for i := 0; i < len(key); i++ {
			require.True(t, key[i] >= 0x20 && key[i] <= 0x7e, "%q: byte %d of %q", value, i, key)
		}
		if trimmed := strings.Trim(value, " \t"); trimmed[0] != '"' {
			require.Equal(t, trimmed, key, "a bare value is its own key")
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		again, problem := ParseKey(quoted)
		require.Empty(t, problem, "%q (the key of %q) quoted as %q", key, value, quoted)
		require.Equal(t, key, again)
	})
}
