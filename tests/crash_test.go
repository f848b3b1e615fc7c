package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/internal/logbuf"
	"github.com/keyedhq/keyed/orders"
)

// buildWorker builds cmd/worker into a temporary directory.
func buildWorker(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "worker")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/keyedhq/keyed/cmd/worker").CombinedOutput()
	require.NoError(t, err, "build cmd/worker: %s", out)
	return bin
}

// spawnWorker starts the real worker binary as a separate process against
// the test's schema, task queue and fakes.
func (b *bundle) spawnWorker(t *testing.T, bin string) (*exec.Cmd, *logbuf.Buffer) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+b.dbURL,
		"TEMPORAL_ADDRESS="+temporalAddr,
		"TEMPORAL_NAMESPACE=default",
		"TEMPORAL_TASK_QUEUE="+b.taskQueue,
		"METRICS_ADDR=127.0.0.1:0",
	)
	cmd.Env = append(cmd.Env, b.workerEnv()...)
	out := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, out
}

// 5. The worker process is SIGKILLed after Stripe charged and before the
// activity completed; a new worker process finishes the order with one
// charge and one email.
func TestWorkerKilledAfterCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bin := buildWorker(t)
	b.order(t, "o5", 1999, "pm_card_visa")
	// The charge happens at once; its response is held back long enough to
	// kill the worker that is waiting for it.
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultHoldResponse, Delay: 20 * time.Second})

	first, out := b.spawnWorker(t, bin)
	st := b.start(t, orders.NewOrderInput(b.tenant, "o5"))
	require.Eventually(t, func() bool { return b.stripe.Charges() == 1 }, 60*time.Second, 50*time.Millisecond,
		"the first worker never charged; its output:\n%s", out)
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()

	_, out2 := b.spawnWorker(t, bin)
	_, err := b.wait(t, st)
	require.NoError(t, err, "second worker output:\n%s", out2)
	require.Equal(t, 1, b.stripe.Charges())
	require.Equal(t, 1, b.mail.Count())
	got, err := b.orders.Get(b.ctx, b.tenant, "o5")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPaid, got.Status)
	rec := b.records(t, "o5")[orders.StepCharge]
	require.GreaterOrEqual(t, rec.Attempts, 2, "the charge step must have been re-entered")
}

// 6. The worker process is SIGKILLed while MarkPaid's one statement runs:
// the statement commits after the worker is gone, so the order is paid
// but the run never recorded MarkPaid's local activity. A new worker runs
// MarkPaid again, which finds its own transition: one charge, one
// transition to paid, one email.
func TestWorkerKilledDuringMarkPaid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bin := buildWorker(t)
	b.order(t, "o6", 1999, "pm_card_visa")
	// MarkPaid's statement waits 8 s inside its transition's insert, before
	// it commits.
	_, err := b.pool.Exec(b.ctx, `
CREATE FUNCTION hold_paid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.to_state = 'paid' THEN
        PERFORM pg_sleep(8);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER hold_paid AFTER INSERT ON order_transitions FOR EACH ROW EXECUTE FUNCTION hold_paid();`)
	require.NoError(t, err)
	paid := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM order_transitions
			WHERE tenant_id = $1 AND order_id = 'o6' AND to_state = 'paid'`, b.tenant).Scan(&n))
		return n
	}

	first, out := b.spawnWorker(t, bin)
	st := b.start(t, orders.NewOrderInput(b.tenant, "o6"))
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event = 'PgSleep' AND query LIKE '%order_transitions%'`).Scan(&n))
		return n > 0 || paid() > 0
	}, 60*time.Second, 20*time.Millisecond, "MarkPaid never ran; the first worker's output:\n%s", out)
	require.Zero(t, paid(), "MarkPaid committed before the worker was killed")
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()
	require.Eventually(t, func() bool { return paid() == 1 }, 30*time.Second, 50*time.Millisecond,
		"the statement of the killed worker did not commit")
	_, err = b.pool.Exec(b.ctx, `DROP TRIGGER hold_paid ON order_transitions`)
	require.NoError(t, err)

	_, out2 := b.spawnWorker(t, bin)
	_, err = b.wait(t, st)
	require.NoError(t, err, "second worker output:\n%s", out2)
	require.Equal(t, 1, b.stripe.Charges())
	require.Equal(t, 1, b.mail.Count())
	require.Equal(t, 1, paid())
	got, err := b.orders.Get(b.ctx, b.tenant, "o6")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPaid, got.Status)
}
