package effectstest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
)

// ExampleSecondRun checks that a keyed handler is idempotent: the second
// run leaves keyed_effects as the first left it, and the provider saw one
// call. In a test, t is the test's *testing.T.
func ExampleSecondRun() {
	t := &exampleT{}
	defer t.cleanup()

	pool := effectstest.NewPool(t)
	client := effectstest.NewClient(t, pool, nil)
	calls := 0
	handler := func(ctx context.Context) error {
		key := effects.MustKey("acme", "order", "9f3a", "charge")
		_, err := effects.Do(ctx, client, effects.ClaimParams{Key: key, Owner: "order-9f3a/charge"},
			func(ctx context.Context, claim *effects.Claim) (string, error) {
				calls++
				return "pi_123", nil
			}, nil)
		return err
	}

	effectstest.SecondRun(t, pool, []string{"keyed_effects"}, handler)
	fmt.Println("failed:", t.failed, "provider calls:", calls)
	// Output:
	// failed: false provider calls: 1
}

// exampleT stands in for the *testing.T that a real test passes.
type exampleT struct {
	testing.TB
	failed   bool
	cleanups []func()
}

func (t *exampleT) Helper()                   {}
func (t *exampleT) Cleanup(f func())          { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Logf(string, ...any)       {}
func (t *exampleT) Errorf(f string, a ...any) { t.failed = true; fmt.Printf(f+"\n", a...) }
func (t *exampleT) Fatalf(f string, a ...any) { t.Errorf(f, a...); t.FailNow() }
func (t *exampleT) FailNow()                  { panic("test failed") }
func (t *exampleT) Name() string              { return "ExampleSecondRun" }

func (t *exampleT) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
