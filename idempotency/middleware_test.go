package idempotency_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/idempotency"
	"github.com/keyedhq/keyed/internal/dbtest"
)

// bundle is one test's schema, middleware and server: POST /v1/things
// writes a row and stores its 201 in the same transaction. A body whose
// plan is "fail" fails the first time, writing nothing; "hold" waits for
// release before it answers.
type bundle struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	m       *idempotency.Middleware
	srv     *httptest.Server
	fails   atomic.Int64
	held    chan struct{}
	release chan struct{}
	seen    []string
	mu      sync.Mutex
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{ctx: context.Background(), pool: dbtest.NewPool(t), held: make(chan struct{}, 8), release: make(chan struct{})}
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE things (tenant text, id text, plan text, PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	b.m, err = idempotency.New(b.pool, &idempotency.Opts{
		Tenant:  func(r *http.Request) string { return r.Header.Get("X-Tenant") }, // authentication, for the test
		MaxWait: 5 * time.Second,
		Observe: func(o string) { b.mu.Lock(); b.seen = append(b.seen, o); b.mu.Unlock() },
		Logger:  slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/things", b.m.Wrap(http.HandlerFunc(b.create)))
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	return b
}

func (b *bundle) create(w http.ResponseWriter, r *http.Request) {
	q := idempotency.FromContext(r.Context())
	var in struct{ ID, Plan string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		idempotency.WriteError(w, idempotency.NewError(http.StatusBadRequest, "invalid_json", "", "%v", err))
		return
	}
	switch in.Plan {
	case "fail":
		if b.fails.Add(1) == 1 {
			b.m.Fail(w, r, "create thing", errors.New("boom"))
			return
		}
	case "hold":
		b.held <- struct{}{}
		<-b.release
	}
	resp, err := idempotency.JSON(http.StatusCreated, map[string]string{"id": in.ID, "tenant": q.Tenant(), "at": time.Now().String()})
	if err != nil {
		b.m.Fail(w, r, "create thing", err)
		return
	}
	resp.Header = http.Header{"Location": {"/v1/things/" + in.ID}}
	err = pgx.BeginFunc(r.Context(), b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(r.Context(), `INSERT INTO things VALUES ($1, $2, $3)`, q.Tenant(), in.ID, in.Plan); err != nil {
			return err
		}
		return q.CompleteTx(r.Context(), tx, resp)
	})
	if err != nil {
		b.m.Fail(w, r, "create thing", err)
		return
	}
	resp.Write(w)
}

type response struct {
	status int
	header http.Header
	body   string
}

func (b *bundle) post(t *testing.T, tenant, key, body string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest("POST", b.srv.URL+"/v1/things", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-Tenant", tenant)
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{resp.StatusCode, resp.Header, string(got)}
}

func (b *bundle) rows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM things`).Scan(&n))
	return n
}

func errorCode(t *testing.T, r response) string {
	t.Helper()
	var e struct{ Error idempotency.Error }
	require.NoError(t, json.Unmarshal([]byte(r.body), &e), r.body)
	return e.Error.Code
}

// A retry, bare or quoted, replays the first response byte for byte with
// its stored headers; another body under the key is 422; another tenant's
// same key is its own.
func TestReplayReusedKeyAndTenants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.post(t, "acme", "k1", `{"id":"t1"}`)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Empty(t, first.header.Get(idempotency.HeaderReplayed))
	for _, key := range []string{"k1", `"k1"`, ` k1 `} {
		again := b.post(t, "acme", key, `{"id":"t1"}`)
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, first.body, again.body)
		require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed))
		require.Equal(t, "/v1/things/t1", again.header.Get("Location"))
		require.Equal(t, "application/json", again.header.Get("Content-Type"))
	}
	reused := b.post(t, "acme", "k1", `{"id":"t2"}`)
	require.Equal(t, http.StatusUnprocessableEntity, reused.status)
	require.Equal(t, idempotency.CodeKeyReused, errorCode(t, reused))

	other := b.post(t, "globex", "k1", `{"id":"t1"}`)
	require.Equal(t, http.StatusCreated, other.status, other.body)
	require.Empty(t, other.header.Get(idempotency.HeaderReplayed))
	require.Contains(t, other.body, `"tenant":"globex"`)
	require.Equal(t, 2, b.rows(t))
	require.Equal(t, []string{"new", "replayed", "replayed", "replayed", "key_reused", "new"}, b.seen)
}

// Without a key, with two or a malformed one: 400, and the handler never
// runs.
func TestKeyIsRequiredAndChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, idempotency.CodeMissingKey, errorCode(t, b.post(t, "acme", "", `{"id":"t1"}`)))
	require.Equal(t, idempotency.CodeInvalidKey, errorCode(t, b.post(t, "acme", "two words", `{"id":"t1"}`)))
	require.Equal(t, idempotency.CodeInvalidKey, errorCode(t, b.post(t, "acme", `"open`, `{"id":"t1"}`)))
	require.Equal(t, idempotency.CodeInternal, errorCode(t, b.post(t, "", "k", `{"id":"t1"}`)), "no tenant: not behind authentication")
	require.Zero(t, b.rows(t))
}

// A failure that wrote nothing releases the key: the retry runs at once
// and its response is the one stored.
func TestFailureReleasesTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	failed := b.post(t, "acme", "k-fail", `{"id":"t1","plan":"fail"}`)
	require.Equal(t, http.StatusInternalServerError, failed.status)
	retry := b.post(t, "acme", "k-fail", `{"id":"t1","plan":"fail"}`)
	require.Equal(t, http.StatusCreated, retry.status, retry.body)
	again := b.post(t, "acme", "k-fail", `{"id":"t1","plan":"fail"}`)
	require.Equal(t, retry.body, again.body)
	require.Equal(t, 1, b.rows(t))
}

// While the first request runs, a retry is 409 with Retry-After; one that
// prefers to wait gets the first request's response once it is stored.
func TestInFlightIs409OrWaitedFor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := make(chan response, 1)
	go func() { first <- b.post(t, "acme", "k-hold", `{"id":"t1","plan":"hold"}`) }()
	<-b.held
	busy := b.post(t, "acme", "k-hold", `{"id":"t1","plan":"hold"}`)
	require.Equal(t, http.StatusConflict, busy.status)
	require.Equal(t, idempotency.CodeRequestInProgress, errorCode(t, busy))
	require.Equal(t, "1", busy.header.Get("Retry-After"))

	waited := make(chan response, 1)
	go func() {
		waited <- b.post(t, "acme", "k-hold", `{"id":"t1","plan":"hold"}`, idempotency.HeaderPrefer, "wait=5")
	}()
	close(b.release)
	got := <-first
	w := <-waited
	require.Equal(t, http.StatusCreated, got.status)
	require.Equal(t, got.body, w.body, "one answer")
	require.Equal(t, "true", w.header.Get(idempotency.HeaderReplayed))
	require.Equal(t, 1, b.rows(t))
}

// A record of the earlier form (the body as a JSON string) replays as
// stored; a Kept that does not render its Body is refused.
func TestStoredFormsAndRendering(t *testing.T) {
	t.Parallel()
	b := setup(t)
	claims := effectstest.NewClient(t, b.pool, nil)
	key, err := idempotency.StoredKey("acme", "k-old")
	require.NoError(t, err)
	cl, err := claims.Claim(b.ctx, effects.ClaimParams{Key: key, Kind: idempotency.Kind, Owner: "old", Fingerprint: "x", Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, claims.Complete(b.ctx, cl, json.RawMessage(`{"status":201,"body":"{\"id\":\"old\"}\n"}`)))

	m, err := idempotency.New(b.pool, &idempotency.Opts{Tenant: func(*http.Request) string { return "acme" }})
	require.NoError(t, err)
	var stored error
	h := m.Route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := idempotency.FromContext(r.Context())
		stored = pgx.BeginFunc(r.Context(), b.pool, func(tx pgx.Tx) error {
			return q.CompleteTx(r.Context(), tx, idempotency.Response{Status: 201, Body: []byte("a\n"), Kept: json.RawMessage(`"b"`)})
		})
		w.WriteHeader(http.StatusInternalServerError)
	}), &idempotency.RouteOpts{
		Fingerprint: func(http.ResponseWriter, *http.Request) (string, any, error) { return "x", nil, nil },
		Replay:      func(_ any, kept json.RawMessage) ([]byte, error) { return append(kept, '\n'), nil },
	})
	serve := func(key string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/", strings.NewReader(""))
		req.Header.Set(idempotency.HeaderKey, key)
		h.ServeHTTP(rec, req)
		return rec
	}
	old := serve("k-old")
	require.Equal(t, 201, old.Code)
	require.Equal(t, "{\"id\":\"old\"}\n", old.Body.String())
	require.Equal(t, "true", old.Header().Get(idempotency.HeaderReplayed))

	serve("k-new")
	require.ErrorIs(t, stored, idempotency.ErrNotRendered)
}

func TestPreferredWait(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		header []string
		want   time.Duration
		ok     bool
	}{
		{nil, 0, false},
		{[]string{"wait=10"}, 10 * time.Second, true},
		{[]string{"respond-async, WAIT=3"}, 3 * time.Second, true},
		{[]string{"handling=lenient", `wait="4"; x=1`}, 4 * time.Second, true},
		{[]string{"wait=100"}, 20 * time.Second, true},                  // capped
		{[]string{"wait=99999999999999999999"}, 20 * time.Second, true}, // capped, not ignored
		{[]string{"wait=0"}, 0, true},
		{[]string{"wait=-1"}, 0, false},
		{[]string{"wait=soon"}, 0, false},
		{[]string{"return=minimal"}, 0, false},
	} {
		r := httptest.NewRequest("POST", "/", nil)
		for _, h := range c.header {
			r.Header.Add(idempotency.HeaderPrefer, h)
		}
		got, ok := idempotency.PreferredWait(r, 20*time.Second)
		require.Equal(t, c.ok, ok, "%q", c.header)
		require.Equal(t, c.want, got, "%q", c.header)
	}
	r := httptest.NewRequest("POST", "/", nil)
	r.Header.Set(idempotency.HeaderPrefer, "wait=5")
	_, ok := idempotency.PreferredWait(r, 0)
	require.False(t, ok, "no wait without a server maximum")
}

// A holder that died (its lease ran out, nothing stored) is taken over:
// the retry runs the handler and its response is the one stored.
func TestDeadHolderIsTakenOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	claims, err := effects.NewClient(b.pool, nil)
	require.NoError(t, err)
	key, err := idempotency.StoredKey("acme", "k-dead")
	require.NoError(t, err)
	// The default fingerprint of the same request: method, pattern, body.
	sum := sha256.Sum256([]byte("POST POST /v1/things\x00" + `{"id":"t1"}`))
	_, err = claims.Claim(b.ctx, effects.ClaimParams{Key: key, Kind: idempotency.Kind, Owner: "dead", Lease: time.Minute,
		Fingerprint: hex.EncodeToString(sum[:])})
	require.NoError(t, err)
	busy := b.post(t, "acme", "k-dead", `{"id":"t1"}`)
	require.Equal(t, http.StatusConflict, busy.status, "%s", busy.body)
	_, err = b.pool.Exec(b.ctx, `UPDATE keyed_effects SET lease_until = now() - interval '1 second' WHERE key = $1`, key.String())
	require.NoError(t, err)
	took := b.post(t, "acme", "k-dead", `{"id":"t1"}`)
	require.Equal(t, http.StatusCreated, took.status, "%s", took.body)
	require.Equal(t, took.body, b.post(t, "acme", "k-dead", `{"id":"t1"}`).body)
	require.Equal(t, []string{"in_progress", "takeover", "replayed"}, b.seen)
}
