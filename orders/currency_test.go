package orders_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/orders"
)

func TestNormalizeCurrency(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"eur": "eur", "EUR": "eur", "DkK": "dkk", "xyz": "xyz"} {
		got, err := orders.NormalizeCurrency(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	// strings.ToLower would make the Danish krone of these.
	for _, in := range []string{"DK\u212a", "dk\u212a", "\u212a\u212a\u212a", "usd\u00a0"} {
		_, err := orders.NormalizeCurrency(in)
		var verr *orders.ValidationError
		require.ErrorAs(t, err, &verr, "%q", in)
		require.Equal(t, "currency", verr.Field)
		require.Contains(t, verr.Reason, "non-ASCII")
	}
}

func TestFormatAmount(t *testing.T) {
	t.Parallel()
	require.Equal(t, "12.50 EUR", orders.FormatAmount(1250, "eur"))
	require.Equal(t, "0.05 USD", orders.FormatAmount(5, "usd"))
	require.Equal(t, "1250 JPY", orders.FormatAmount(1250, "jpy"))
}
