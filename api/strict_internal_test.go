package api

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/idempotency"
)

func TestLoneSurrogate(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]int{
		`{"a":"x"}`:                      -1,
		`{"a":"\u00e9\n\\u"}`:            -1, // an escaped backslash before a u
		`{"a":"\ud83d\ude00"}`:           -1, // a pair
		`{"a":"\ud83d"}`:                 6,
		`{"a":"\ud83d\u0041"}`:           6,
		`{"a":"\ude00"}`:                 6,
		`{"a":"\\\ud800"}`:               8,
		`{"a":"ok \ud83d\ude00 \udfff"}`: 22,
	} {
		require.Equal(t, want, loneSurrogate([]byte(body)), body)
	}
}

// An error quotes at most idempotency.MaxEchoBytes of a refused value, never cutting a
// character in two.
func TestEchoCutsLongInput(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("r", 600)
	for in, want := range map[string]string{
		"r1":                                   `"r1"`,
		long[:idempotency.MaxEchoBytes]:        `"` + long[:idempotency.MaxEchoBytes] + `"`,
		long:                                   `"` + long[:idempotency.MaxEchoBytes] + `"...`,
		strings.Repeat("r", 63) + "é" + "tail": `"` + strings.Repeat("r", 63) + `"...`,
		"a\nb":                                 `"a\nb"`,
	} {
		require.Equal(t, want, echo(in), in)
	}
}
