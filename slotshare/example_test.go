package slotshare_test

import (
	"fmt"

	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"

	"github.com/keyedhq/keyed/slotshare"
)

// A worker with 64 activity slots, of which one tenant may hold 56.
func ExampleNew() {
	lim, err := slotshare.New(&slotshare.Opts{Slots: 64})
	if err != nil {
		panic(err)
	}
	opts := worker.Options{MaxConcurrentActivityExecutionSize: 64, Interceptors: []interceptor.WorkerInterceptor{lim}}
	fmt.Println(lim.Share(), "of", opts.MaxConcurrentActivityExecutionSize)
	// Output: 56 of 64
}
