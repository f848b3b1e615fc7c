package effectstest_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects/effectstest"
)

// fatalT records the message a helper fails with and ends the helper's
// goroutine, as t.Fatalf would.
type fatalT struct {
	testing.TB
	msg string
}

func (t *fatalT) Helper()          {}
func (t *fatalT) Cleanup(f func()) {}
func (t *fatalT) Fatalf(f string, a ...any) {
	t.msg = fmt.Sprintf(f, a...)
	runtime.Goexit()
}

// A Postgres with no connection to spare is not a Postgres to start: the
// message says what holds them. A role allowed no connection stands in for
// a full server (the same SQLSTATE, 53300).
func TestNewSchemaSaysWhenPostgresHasNoFreeConnection(t *testing.T) {
	ctx := context.Background()
	base := effectstest.DatabaseURL()
	conn, err := pgx.Connect(ctx, base)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close(ctx)) })
	role := "keyed_full_" + strings.ToLower(rand.Text())[:8]
	_, err = conn.Exec(ctx, "CREATE ROLE "+role+" LOGIN CONNECTION LIMIT 0")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := conn.Exec(ctx, "DROP ROLE "+role)
		require.NoError(t, err)
	})

	u, err := url.Parse(base)
	require.NoError(t, err)
	u.User = url.User(role)
	t.Setenv("DATABASE_URL", u.String())

	ft := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		effectstest.NewSchema(ft)
	}()
	<-done
	require.Contains(t, ft.msg, "has no free connection")
	require.Contains(t, ft.msg, "make demo KEEP=1")
	require.NotContains(t, ft.msg, "Start it with")
}
