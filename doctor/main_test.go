package doctor_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/fxapp"
)

// server is the package's Temporal dev server; each test deploys into a
// namespace of its own on it.
var server *devserver.Server

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	srv, err := devserver.Start(ctx, devserver.ForTests())
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "doctor tests need the Temporal dev server (run `make tools` to build bin/temporal, or set KEYED_TEMPORAL_BIN): %v\n", err)
		os.Exit(1)
	}
	server = srv
	code := m.Run()
	if err := srv.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stop the dev server: %v\n", err)
	}
	os.Exit(code)
}

// allAttributes are keyed's search attributes, as devserver registers them.
var allAttributes = func() map[string]enumspb.IndexedValueType {
	out := map[string]enumspb.IndexedValueType{}
	for _, sa := range devserver.SearchAttributes() {
		name, typ, _ := strings.Cut(sa, "=")
		out[name] = enumspb.IndexedValueType(enumspb.IndexedValueType_value["INDEXED_VALUE_TYPE_"+strings.ToUpper(typ)])
	}
	return out
}()

// deployment is a keyed deployment under test: a namespace of its own on
// the dev server, a client of it, a fresh schema, and doctor options that
// describe a healthy worker.
type deployment struct {
	ctx    context.Context
	ns     string
	client client.Client
	pool   *pgxpool.Pool
	opts   doctor.Opts
}

func dial(t *testing.T, ns string) client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{HostPort: server.Address(), Namespace: ns,
		Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// deploy registers a namespace with retention and the search attributes
// attrs, and returns a deployment on it with a fresh schema.
func deploy(t *testing.T, retention time.Duration, attrs map[string]enumspb.IndexedValueType) *deployment {
	t.Helper()
	ctx := context.Background()
	ns := "doctor-" + strings.ToLower(rand.Text())[:8]
	admin := dial(t, server.Namespace())
	_, err := admin.WorkflowService().RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
		Namespace: ns, WorkflowExecutionRetentionPeriod: durationpb.New(retention)})
	require.NoError(t, err)
	if len(attrs) > 0 {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			_, err := admin.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
				Namespace: ns, SearchAttributes: attrs})
			assert.NoError(c, err)
		}, 30*time.Second, 200*time.Millisecond, "add search attributes to %s", ns)
	}
	d := &deployment{ctx: ctx, ns: ns, client: dial(t, ns), pool: dbtest.NewPool(t)}
	// The frontend knows the namespace once a visibility list succeeds.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := d.client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: "WorkflowType = 'x'"})
		assert.NoError(c, err)
	}, 30*time.Second, 200*time.Millisecond, "namespace %s ready", ns)
	d.opts = doctor.Opts{
		Namespace: ns, CheckRetention: fxapp.CheckRetention,
		Pool: fxapp.DoctorOpts(&config.Config{Role: config.Worker,
			Worker: config.WorkerTuning{MaxConcurrentActivities: config.DefaultMaxActivities}}, nil).Pool,
		RulesFile: "../deploy/prometheus/keyed.rules.yml",
	}
	return d
}

// run runs the checks named with d's options changed by edit.
func (d *deployment) run(t *testing.T, edit func(*doctor.Opts), checks ...string) *doctor.Report {
	t.Helper()
	o := d.opts
	o.Checks = checks
	if edit != nil {
		edit(&o)
	}
	ctx, cancel := context.WithTimeout(d.ctx, time.Minute)
	defer cancel()
	rep, err := doctor.Run(ctx, doctor.Deps{Pool: d.pool, Temporal: d.client}, &o)
	require.NoError(t, err)
	return rep
}

// one returns the single check named name about subject.
func one(t *testing.T, rep *doctor.Report, name, subject string) doctor.Check {
	t.Helper()
	cs := rep.Find(name, subject)
	require.Len(t, cs, 1, "%s %s in %+v", name, subject, rep.Checks)
	return cs[0]
}

// record inserts a finished effect record of kind (the key's last part)
// created at created and finished took later, claimed attempts times.
func (d *deployment) record(t *testing.T, key string, created time.Time, took time.Duration, attempts int) {
	t.Helper()
	parts := strings.Split(key, ":")
	d.recordKind(t, key, parts[len(parts)-1], created, took, attempts)
}

// recordKind is record with the kind given.
func (d *deployment) recordKind(t *testing.T, key, kind string, created time.Time, took time.Duration, attempts int) {
	t.Helper()
	tenant, _, _ := strings.Cut(key, ":")
	_, err := d.pool.Exec(d.ctx, `INSERT INTO keyed_effects
(key, tenant_id, kind, state, owner, attempts, result, created_at, updated_at, finished_at)
VALUES ($1, $2, $3, 'succeeded', 'test', $4, '{}', $5, $6, $6)`, key, tenant, kind, attempts, created, created.Add(took))
	require.NoError(t, err)
}
