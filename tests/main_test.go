// Package tests holds keyed's end-to-end tests: a real Temporal dev server,
// a real Postgres, and fakes standing in for Stripe and SendGrid only.
package tests

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/keyedhq/keyed/internal/devserver"
)

// temporalAddr is the dev server shared by every test in the package. Tests
// stay apart by using their own tenant (so their own workflow IDs), their
// own task queue and their own Postgres schema.
var temporalAddr string

func TestMain(m *testing.M) {
	srv, err := devserver.Start(context.Background(), &devserver.Opts{UIPort: -1})
	if err != nil {
		fmt.Fprintf(os.Stderr, "tests: cannot start the Temporal dev server: %v\n", err)
		os.Exit(1)
	}
	temporalAddr = srv.Address()
	code := m.Run()
	_ = srv.Stop()
	os.Exit(code)
}
