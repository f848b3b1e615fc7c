package stripestep

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

// keyQuery quotes the key in Stripe's search syntax, whose quote and
// backslash it escapes.
func TestKeyQueryQuotesTheKey(t *testing.T) {
	t.Parallel()
	k, err := effects.NewKey("acme", "order", "9f3a", "charge")
	require.NoError(t, err)
	require.Equal(t, `metadata['effect_key']:'acme:order:9f3a:charge'`, keyQuery(k))
}
