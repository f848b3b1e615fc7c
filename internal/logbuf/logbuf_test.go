package logbuf_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/logbuf"
)

func TestBufferKeepsEveryConcurrentWrite(t *testing.T) {
	t.Parallel()
	var b logbuf.Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				_, err := fmt.Fprintf(&b, "%d-%d\n", i, j)
				require.NoError(t, err)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	require.Len(t, strings.Split(strings.TrimSpace(b.String()), "\n"), 800)
}
