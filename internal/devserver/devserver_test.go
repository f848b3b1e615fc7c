package devserver_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/internal/devserver"
)

func TestStartRegistersSearchAttributes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := devserver.Start(ctx, &devserver.Opts{UIPort: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })

	c, err := client.Dial(client.Options{HostPort: srv.Address()})
	require.NoError(t, err)
	defer c.Close()
	resp, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: srv.Namespace()})
	require.NoError(t, err)
	require.Contains(t, resp.CustomAttributes, "TenantID")
	require.Contains(t, resp.CustomAttributes, "OrderID")
	require.Contains(t, resp.CustomAttributes, "KeyedAttention")
}
