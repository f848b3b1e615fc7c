package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/logbuf"
)

func TestReportFitsAHundredColumnsAndExplainsItself(t *testing.T) {
	t.Parallel()
	rows := []row{
		{order: "A-150405.3", scenario: "happy path", runs: 1, duplicates: 4, later: "refused", outcome: "paid, receipt sent",
			charges: 1, workflowID: "order:demo:A-150405.3:fulfil", charge: "pi_3MtwBwLkdIwHu7ix28a3tqPa succeeded",
			receipt: "14c5d75ce93.dfd.64b469.filter0001p3las1-2-5f5f-1", effects: "charge=succeeded mark_paid=succeeded receipt=succeeded"},
		{order: "D-150405.3", scenario: "card declined", runs: 1, duplicates: 4, later: "re-ran: CardDeclined",
			outcome: "failed: PaymentIncomplete and then some", charges: 0, workflowID: "order:demo:D-150405.3:fulfil",
			charge: "none", receipt: "not sent", effects: strings.Repeat("charge=failed_terminal mark_failed=succeeded ", 4)},
	}
	var b bytes.Buffer
	require.NoError(t, printReport(&b, rows, 5, true))
	out := b.String()
	for i, line := range strings.Split(out, "\n") {
		require.LessOrEqual(t, utf8.RuneCountInString(line), maxWidth, "line %d is too wide:\n%s", i+1, line)
	}
	require.Regexp(t, `(?m)^ORDER\s+SCENARIO\s+NEW\s+DUPLICATE\s+LATER START\s+OUTCOME\s+CHARGES$`, out)
	require.Regexp(t, `(?m)^A-150405\.3\s+happy path\s+1\s+4\s+refused\s+paid, receipt sent\s+1$`, out)
	for _, words := range []string{"Each order got 5 concurrent starts", "NEW counts the starts\nthat began a workflow run",
		"DUPLICATE counts the starts Temporal suppressed", "LATER START is one more start", "CHARGES counts the charges"} {
		require.Contains(t, out, words)
	}
	require.NotContains(t, out, "new/duplicates suppressed")
	require.Contains(t, out, "  re-run    ended CardDeclined")
}

func TestRefundReportFitsAHundredColumnsAndExplainsItself(t *testing.T) {
	t.Parallel()
	rows := []refundRow{
		{refund: "R1", order: "B-150405.3", scenario: "partial refund", amount: "9.99 EUR", runs: 1, duplicates: 5,
			outcome: "refunded, email sent", refunds: 1, details: [][2]string{{"workflow", "refund:demo:B-150405.3:R1"},
				{"effects", strings.Repeat("refund_reserve=succeeded refund_stripe=succeeded ", 4)}}},
		{refund: "R2", order: "B-150405.3", scenario: "more than is left", amount: "49.99 EUR", outcome: "refused",
			details: [][2]string{{"forced", "refund:demo:B-150405.3:R2 started anyway: InvalidState at Reserve"}}},
	}
	var b bytes.Buffer
	require.NoError(t, printRefunds(&b, rows, 5, true))
	out := b.String()
	for i, line := range strings.Split(out, "\n") {
		require.LessOrEqual(t, utf8.RuneCountInString(line), maxWidth, "line %d is too wide:\n%s", i+1, line)
	}
	require.Regexp(t, `(?m)^REFUND\s+OF ORDER\s+SCENARIO\s+AMOUNT\s+NEW\s+DUPLICATE\s+OUTCOME\s+REFUNDS$`, out)
	require.Regexp(t, `(?m)^R1\s+B-150405\.3\s+partial refund\s+9\.99 EUR\s+1\s+5\s+refunded, email sent\s+1$`, out)
	require.Regexp(t, `(?m)^R2\s+B-150405\.3\s+more than is left\s+49\.99 EUR\s+0\s+0\s+refused\s+0$`, out)
	require.Contains(t, out, "REFUNDS counts the refunds the fake Stripe made")
	require.Contains(t, out, "  forced    refund:demo:B-150405.3:R2 started anyway: InvalidState at Reserve")
}

func TestSuppressedReadsTheMetricByKind(t *testing.T) {
	t.Parallel()
	body := []byte("# TYPE keyed_effect_duplicates_suppressed_total counter\n" +
		"keyed_effect_duplicates_suppressed_total{kind=\"receipt\"} 0\n" +
		"keyed_effect_duplicates_suppressed_total{kind=\"charge\"} 2\n" +
		"keyed_effect_claims_acquired_total{kind=\"charge\"} 9\n")
	require.Equal(t, "charge 2, receipt 0", suppressed(body))
	require.Equal(t, "none", suppressed([]byte("go_goroutines 7\n")))
}

// failingWriter fails every write.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteErrorsAreReturnedOnce(t *testing.T) {
	t.Parallel()
	w := &errWriter{w: failingWriter{}}
	st := &stack{out: w}
	st.say("starting")
	st.say("still starting")
	require.ErrorContains(t, w.err, "disk full", "a failed progress line is kept")
	require.Equal(t, w.err, w.unreported(nil), "run returns it")
	require.NoError(t, w.unreported(fmt.Errorf("print: %w", w.err)), "but not twice")
	require.ErrorIs(t, printReport(w, nil, 1, false), w.err)
}

func TestEnvFileIsSourceable(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "env")
	vars := []string{
		"DATABASE_URL=postgres://u:p'a$s%20\"w@127.0.0.1:5432/postgres?sslmode=disable&search_path=keyed_demo_0a1b2c3d",
		"TEMPORAL_ADDRESS=127.0.0.1:41234",
		"KEYED_DEMO_WEB_UI=http://127.0.0.1:8233/namespaces/default/workflows?query=TenantID%3D%22demo%22",
	}
	written, err := writeEnvFile(path, "0a1b2c3d", vars)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "DATABASE_URL may hold a password")
	onDisk, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(written), string(onDisk))
	out, err := exec.Command("sh", "-c", `. "$1" && printf '%s\n' "$DATABASE_URL" "$TEMPORAL_ADDRESS" "$KEYED_DEMO_WEB_UI"`, "sh", path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	want := ""
	for _, v := range vars {
		_, value, _ := strings.Cut(v, "=")
		want += value + "\n"
	}
	require.Equal(t, want, string(out))

	var b bytes.Buffer
	require.NoError(t, printKeep(&b, ".demo/env", vars, "A-1", ".demo/worker.log"))
	require.NotContains(t, b.String(), "p'a$s", "the terminal never shows the database password")
	require.Contains(t, b.String(), "source .demo/env")
}

// A demo removes .demo/env when it exits only if the file is still its
// own, and on start only if the demo that wrote it is gone.
func TestEnvFileBelongsToItsDemo(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "env")
	mine, err := writeEnvFile(path, "0a1b2c3d", []string{"TEMPORAL_ADDRESS=127.0.0.1:1"})
	require.NoError(t, err)
	require.NoError(t, removeStaleEnv(path))
	require.FileExists(t, path, "its demo (this process) still runs")
	require.NoError(t, removeOwnEnv(path, nil))
	require.FileExists(t, path, "a demo that wrote nothing removes nothing")

	theirs, err := writeEnvFile(path, "4e5f6a7b", []string{"TEMPORAL_ADDRESS=127.0.0.1:2"})
	require.NoError(t, err)
	require.NoError(t, removeOwnEnv(path, mine))
	require.FileExists(t, path, "another demo's file stays")
	require.NoError(t, removeOwnEnv(path, theirs))
	require.NoFileExists(t, path)
	require.NoError(t, removeOwnEnv(path, theirs), "gone already is fine")

	// A process that has exited: its demo is gone, and so are its servers.
	gone := exec.Command("true")
	require.NoError(t, gone.Run())
	stale := strings.Replace(string(mine), fmt.Sprintf("process %d.", os.Getpid()), fmt.Sprintf("process %d.", gone.Process.Pid), 1)
	require.NotEqual(t, string(mine), stale)
	for _, content := range []string{stale, "export TEMPORAL_ADDRESS=gone:1\n"} {
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		require.NoError(t, removeStaleEnv(path))
		require.NoFileExists(t, path, "%q", content)
	}
}

// TestDemosRunSideBySideAndTheCLIReachesTheKeptOne runs two demos from one
// checkout on one Postgres, against real dev servers and workers: one kept
// up (make demo KEEP=1), and while it runs another without keep. Each has
// its own schema and task queue, the second neither links to its stopped
// servers nor touches the first's .demo/env, and a shell that sources
// .demo/env reaches the kept demo with bin/starter and sees only its
// orders. Each demo drops its schema when it exits, and a schema left by a
// demo that is gone is dropped by the next.
func TestDemosRunSideBySideAndTheCLIReachesTheKeptOne(t *testing.T) {
	temporalBin, err := devserver.FindBinary()
	require.NoError(t, err, "the demo needs the Temporal dev server: run `make tools`")
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	bins := t.TempDir()
	build := exec.Command("go", "build", "-o", bins+"/", "./cmd/worker", "./cmd/starter")
	build.Dir = root
	began := time.Now()
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	t.Logf("built the worker and starter in %s", time.Since(began).Round(time.Second))
	t.Setenv("KEYED_TEMPORAL_BIN", temporalBin)
	t.Chdir(t.TempDir())
	opts := options{uiPort: 0, metricsPort: 0, workerBin: filepath.Join(bins, "worker"), duplicates: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	db, err := pgx.Connect(ctx, effectstest.DatabaseURL())
	require.NoError(t, err, "connect to Postgres (run `make postgres`)")
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	schemaExists := func(name string) bool {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, name).Scan(&n))
		return n == 1
	}

	// A demo killed before it could clean up left a schema and a file.
	id, err := newID()
	require.NoError(t, err)
	leftover := schemaPrefix + id
	_, err = db.Exec(ctx, "CREATE SCHEMA "+leftover)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+leftover+" CASCADE") })
	require.NoError(t, os.MkdirAll(stateDir, 0o755))
	require.NoError(t, os.WriteFile(envPath(), []byte("export TEMPORAL_ADDRESS=gone:1\n"), 0o600))

	keepOpts := opts
	keepOpts.keep = true
	keepCtx, stop := context.WithCancel(ctx)
	defer stop()
	var kept logbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- run(keepCtx, keepOpts, &kept) }()
	up := func() bool {
		b, err := os.ReadFile(envPath())
		return err == nil && strings.Contains(string(b), "KEYED_DEMO_ID") && strings.Contains(kept.String(), "Worker log: ")
	}
	for !up() {
		select {
		case err := <-done:
			require.Failf(t, "the kept demo ended before it was up", "%v; its output:\n%s", err, &kept)
		case <-ctx.Done():
			require.Failf(t, "the kept demo never wrote "+envPath(), "its output:\n%s", &kept)
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Logf("the kept demo was up after %s", time.Since(began).Round(time.Second))
	require.Contains(t, kept.String(), "source .demo/env")
	keptID, keptSchema, keptQueue := demoOf(t, kept.String())
	require.True(t, schemaExists(keptSchema))
	require.False(t, schemaExists(leftover), "the schema of a demo that is gone is dropped")
	require.Contains(t, kept.String(), "dropped schema "+leftover)
	env, err := os.ReadFile(envPath())
	require.NoError(t, err)
	require.Contains(t, string(env), "search_path="+keptSchema)
	require.Contains(t, string(env), "TEMPORAL_TASK_QUEUE='"+keptQueue+"'")
	keptOrder := firstOrder(t, kept.String())

	// Another demo from the same checkout, on the same Postgres.
	var plain bytes.Buffer
	began = time.Now()
	require.NoError(t, run(ctx, opts, &plain), plain.String())
	report := plain.String()
	t.Logf("the demo without keep took %s:\n%s", time.Since(began).Round(time.Second), report)
	require.NotContains(t, report, "http://", "without keep the demo links to no stopped server")
	require.Contains(t, report, "make demo KEEP=1")
	require.Contains(t, report, "DUPLICATE counts the starts Temporal suppressed")
	require.Regexp(t, `(?m)^R1\s+B-\S+\s+partial refund\s+9\.99 EUR\s+1\s+\d+\s+refunded, email sent\s+1$`, report)
	require.Regexp(t, `(?m)^R1\s+C-\S+\s+full refund\s+3\.00 EUR\s+1\s+\d+\s+refunded, email sent\s+1$`, report)
	require.Regexp(t, `(?m)^R2\s+B-\S+\s+more than is left\s+49\.99 EUR\s+0\s+0\s+refused\s+0$`, report)
	require.Contains(t, report, "InvalidState at Reserve")
	require.Contains(t, report, "partially_refunded after it")
	require.Contains(t, report, "refunded after it")
	require.Contains(t, report, "made 3 charges and 2 refunds")
	for i, line := range strings.Split(report, "\n") {
		require.LessOrEqual(t, utf8.RuneCountInString(line), maxWidth, "line %d: %s", i+1, line)
	}
	plainID, plainSchema, plainQueue := demoOf(t, report)
	require.NotEqual(t, keptID, plainID)
	require.NotEqual(t, keptSchema, plainSchema)
	require.NotEqual(t, keptQueue, plainQueue)
	require.False(t, schemaExists(plainSchema), "a demo drops its schema when it exits")
	require.True(t, schemaExists(keptSchema), "but not another's")
	require.FileExists(t, filepath.Join(stateDir, "worker-"+keptID+".log"))
	require.FileExists(t, filepath.Join(stateDir, "worker-"+plainID+".log"))
	now, err := os.ReadFile(envPath())
	require.NoError(t, err, "the second demo leaves the kept one's %s", envPath())
	require.Equal(t, string(env), string(now))

	// .demo/env reaches the kept demo, and only it.
	show := func(order string) ([]byte, error) {
		cmd := exec.Command("sh", "-c", `. .demo/env && "$1" show --tenant "$KEYED_DEMO_TENANT" --order "$2" --json`, "sh",
			filepath.Join(bins, "starter"), order)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // nothing but what .demo/env sets
		return cmd.CombinedOutput()
	}
	out, err = show(keptOrder)
	require.NoError(t, err, "starter show with .demo/env: %s", out)
	var shown struct {
		Order struct {
			Status string `json:"status"`
		} `json:"order"`
		Workflow struct {
			Error string `json:"error"`
			Steps []any  `json:"steps"`
		} `json:"workflow"`
	}
	require.NoError(t, json.Unmarshal(out, &shown), "%s", out)
	require.Equal(t, "paid", shown.Order.Status)
	require.Empty(t, shown.Workflow.Error, "the workflow query reaches the demo's worker")
	require.NotEmpty(t, shown.Workflow.Steps)
	plainOrder := firstOrder(t, report)
	require.NotEqual(t, keptOrder, plainOrder)
	out, err = show(plainOrder)
	require.Error(t, err, "the other demo's order is not in the kept demo's schema: %s", out)

	began = time.Now()
	stop()
	require.NoError(t, <-done)
	t.Logf("the kept demo stopped %s after Ctrl-C", time.Since(began).Round(time.Second))
	require.NoFileExists(t, envPath(), "the file goes when its servers stop")
	require.False(t, schemaExists(keptSchema), "and so does the schema")
}

// demoOf returns the ID, schema and task queue a demo's output names.
func demoOf(t *testing.T, output string) (id, schema, queue string) {
	t.Helper()
	m := regexp.MustCompile(`demo ([0-9a-f]{8}): Postgres schema (` + schemaPrefix + `[0-9a-f]{8}), task queue (` + taskQueuePrefix + `[0-9a-f]{8})`).
		FindStringSubmatch(output)
	require.NotNil(t, m, output)
	require.Equal(t, schemaPrefix+m[1], m[2])
	require.Equal(t, taskQueuePrefix+m[1], m[3])
	return m[1], m[2], m[3]
}

// firstOrder returns the first order ID of the report's table.
func firstOrder(t *testing.T, report string) string {
	t.Helper()
	_, table, ok := strings.Cut(report, "ORDER ")
	require.True(t, ok, report)
	lines := strings.Split(table, "\n")
	require.Greater(t, len(lines), 1, report)
	return strings.Fields(lines[1])[0]
}
