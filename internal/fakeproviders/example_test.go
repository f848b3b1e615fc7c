package fakeproviders_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/fakecarrier"
	"github.com/keyedhq/keyed/internal/fakeproviders"
)

// carrierRows holds the row docs/adding-an-activity.md adds to Fakes for
// the carrier; it lives here because the shipped pipelines call no carrier.
var carrierRows = []fakeproviders.Fake{
	{Base: "CARRIER_API_BASE", Port: 12113, New: func() http.Handler { return fakecarrier.New() }},
}

// TestTheGuidesCarrierRowServesTheCarrier serves the guide's row.
func TestTheGuidesCarrierRowServesTheCarrier(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(carrierRows[0].New())
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
}
