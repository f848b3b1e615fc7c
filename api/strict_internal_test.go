package api

import (
	"testing"

	"github.com/stretchr/testify/require"
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
