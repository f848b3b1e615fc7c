package api

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// One request of a key at a time, other keys alongside; a waiter whose
// context ends leaves with its error; no gate outlives its users.
func TestGatesGiveOneTurnAKeyAtATime(t *testing.T) {
	t.Parallel()
	var g gates
	keys := []string{"acme\x00o1", "acme\x00o2"}
	var inside [2]atomic.Int32
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			done, err := g.enter(context.Background(), keys[i%2])
			if err != nil {
				t.Error(err)
				return
			}
			if n := inside[i%2].Add(1); n > 1 {
				t.Errorf("%d requests of %q at once", n, keys[i%2])
			}
			time.Sleep(time.Millisecond)
			inside[i%2].Add(-1)
			done()
		})
	}
	wg.Wait()
	require.Zero(t, g.size())

	first, err := g.enter(context.Background(), keys[0])
	require.NoError(t, err)
	other, err := g.enter(context.Background(), keys[1])
	require.NoError(t, err, "another key's turn does not wait")
	other()
	first()

	done, err := g.enter(context.Background(), "k")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = g.enter(ctx, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, 1, g.size())
	done()
	require.Zero(t, g.size())
}
