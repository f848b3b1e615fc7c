package devserver_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/internal/devserver"
)

// TestForTestsServer starts a test's server and checks that it registered
// every search attribute SearchAttributes lists and was started with every
// value of Recommended.
func TestForTestsServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := devserver.Start(ctx, devserver.ForTests())
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })

	c, err := client.Dial(client.Options{HostPort: srv.Address()})
	require.NoError(t, err)
	defer c.Close()
	resp, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: srv.Namespace()})
	require.NoError(t, err)
	for _, sa := range devserver.SearchAttributes() {
		name, _, _ := strings.Cut(sa, "=")
		require.Contains(t, resp.CustomAttributes, name)
	}

	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", srv.PID()))
	require.NoError(t, err)
	args := strings.Split(string(cmdline), "\x00")
	for k, v := range devserver.Recommended() {
		require.Contains(t, args, k+"="+v, "the server's command line: %q", args)
	}
}
