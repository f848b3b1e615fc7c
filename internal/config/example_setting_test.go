package config

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/carrier"
)

// The carrier's settings as docs/adding-an-activity.md adds them: the
// struct goes into config.go with a Carrier field in Config, the rows into
// Settings.

// Carrier is the shipping carrier's API that BuyLabel calls.
type Carrier struct {
	APIKey  Secret // CARRIER_API_KEY
	APIBase string // CARRIER_API_BASE
}

var carrierSettings = []Setting{
	{Env: "CARRIER_API_KEY", Field: "Carrier.APIKey", For: InWorker, Required: InWorker, Secret: true,
		Example: "ck_example", Help: "the shipping carrier's API key, for BuyLabel"},
	{Env: "CARRIER_API_BASE", Flag: "carrier-api-base", Field: "Carrier.APIBase", For: InWorker,
		Default: carrier.DefaultAPIBase, Check: baseURL, Help: "the carrier's API base `URL`, e.g. the fake"},
}

// The walkthrough's rows are well formed: the default passes the check,
// the required secret has an example and no flag.
func TestTheWalkthroughsSettings(t *testing.T) {
	t.Parallel()
	key, base := carrierSettings[0], carrierSettings[1]
	require.True(t, key.Secret && key.Flag == "" && key.Example != "")
	require.NoError(t, base.Check(base.Default, &Config{}))
	require.Error(t, base.Check("ftp://carrier", &Config{}))
	var c Carrier
	require.Empty(t, c.APIBase)
}
