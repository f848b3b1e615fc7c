package fakecarrier_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/carrier"
	"github.com/keyedhq/keyed/internal/fakecarrier"
)

// A purchase repeated under its Idempotency-Key after a lost answer gets
// the first label: one label is bought.
func TestBuyIsIdempotent(t *testing.T) {
	t.Parallel()
	f := fakecarrier.New()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := carrier.New("ck_test", srv.URL, srv.Client())
	require.NoError(t, err)

	f.FailNext = 1
	_, err = c.Buy(context.Background(), "acme:order:o1:label", "o1")
	require.True(t, effects.IsTransient(err), "a 503 is retried: %v", err)
	l, err := c.Buy(context.Background(), "acme:order:o1:label", "o1")
	require.NoError(t, err)
	require.Equal(t, 1, f.Bought())
	got, err := c.Get(context.Background(), l.ID)
	require.NoError(t, err)
	require.Equal(t, l, got)
}
