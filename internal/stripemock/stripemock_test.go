package stripemock_test

import (
	"net/http"
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/stripemock"
)

// The version the tests name is the one `make tools` builds.
func TestVersionIsTheMakefiles(t *testing.T) {
	t.Parallel()
	mk, err := os.ReadFile("../../Makefile")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^STRIPE_MOCK_VERSION\s*:=\s*(\S+)$`).FindSubmatch(mk)
	require.NotNil(t, m, "STRIPE_MOCK_VERSION in the Makefile")
	require.Equal(t, string(m[1]), stripemock.Version)
}

// Start serves Stripe's API: an unauthenticated request is refused as
// Stripe refuses it.
func TestStartServesStripesAPI(t *testing.T) {
	t.Parallel()
	base := stripemock.Start(t)
	resp, err := http.Get(base + "/v1/payment_intents")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}
