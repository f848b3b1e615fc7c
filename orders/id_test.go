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

// An order keeps room for its refunds' keys: a long tenant gets shorter
// order IDs, and one too long for any order is named.
func TestValidateKeepsRoomForRefunds(t *testing.T) {
	t.Parallel()
	o := orders.NewOrder{TenantID: strings.Repeat("t", 150), ID: strings.Repeat("o", orders.MaxIDBytes), AmountMinor: 1,
		Currency: "eur", CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa"}
	var ve *orders.ValidationError
	require.ErrorAs(t, o.Validate(), &ve)
	require.Equal(t, "order_id", ve.Field)
	require.Contains(t, ve.Reason, "its refunds would have effect keys over 255 bytes; at most 9 bytes here")
	o.ID = strings.Repeat("o", 9)
	require.NoError(t, o.Validate())
	o.TenantID = strings.Repeat("t", 170)
	require.ErrorAs(t, o.Validate(), &ve)
	require.Equal(t, "tenant_id", ve.Field)
}
