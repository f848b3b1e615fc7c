package orders_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/orders"
)

// CheckID takes what names one path segment and one key part, and its
// reasons never quote the ID.
func TestCheckID(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"9f3a", "a.b", "...x", "ord_slow?x=1#f%20", strings.Repeat("o", orders.MaxIDBytes)} {
		require.Empty(t, orders.CheckID(id), id)
	}
	for _, id := range []string{"", ".", "..", "a/b", "a:b", "a b", "ünï", "a\x00", strings.Repeat("o", orders.MaxIDBytes+1)} {
		reason := orders.CheckID(id)
		require.NotEmpty(t, reason, "%q", id)
		if len(id) > 2 {
			require.NotContains(t, reason, id, "%q", id)
		}
	}
}
