package pgcluster

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func connect(t *testing.T, ctx context.Context, c *Cluster) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err, "server log:\n%s", c.Log())
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func count(t *testing.T, ctx context.Context, conn *pgx.Conn) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&n))
	return n
}

// A restart, fast or immediate, drops every client connection and keeps
// committed data; a stopped server refuses connections until started.
func TestRestartStopStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := New(t, &Opts{Settings: map[string]string{"max_connections": "20"}})
	require.NotZero(t, c.Port())

	conn := connect(t, ctx, c)
	var maxConns string
	require.NoError(t, conn.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns))
	require.Equal(t, "20", maxConns, "Opts.Settings override the defaults")
	_, err := conn.Exec(ctx, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
	require.NoError(t, err)

	for _, mode := range []string{Fast, Immediate} {
		require.NoError(t, c.Restart(ctx, mode), "server log:\n%s", c.Log())
		_, err = conn.Exec(ctx, "SELECT 1")
		require.Error(t, err, "a restart (%s) drops the client connection", mode)
		conn = connect(t, ctx, c)
		require.Equal(t, 1, count(t, ctx, conn), "committed rows survive a %s restart", mode)
	}

	require.NoError(t, c.Stop(ctx, Fast))
	_, err = pgx.Connect(ctx, c.URL())
	require.Error(t, err, "a stopped server refuses connections")
	require.ErrorIs(t, c.Stop(ctx, Fast), errNotRunning)

	require.NoError(t, c.Start(ctx))
	require.Equal(t, 1, count(t, ctx, connect(t, ctx, c)))
	require.Contains(t, c.Log(), "database system is ready to accept connections")
}

func TestBinDir(t *testing.T) {
	t.Parallel()
	_, err := binDir(t.TempDir())
	require.ErrorContains(t, err, "no initdb in")
	require.Equal(t, 15, majorOf("/usr/lib/postgresql/15/bin/initdb"))
	require.Equal(t, 9, majorOf("/usr/lib/postgresql/9.6/bin/initdb"))
	require.Equal(t, 0, majorOf("/opt/pg/bin/initdb"))
}
