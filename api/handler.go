package api

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/idempotency"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/outbox/temporalstart"
)

// Headers the API reads and writes.
const (
	// HeaderIdempotencyKey is required on POST: 1 to 255 bytes of printable
	// ASCII without spaces, chosen by the client once per logical request
	// and sent unchanged on every retry; bare or as an RFC 8941 string
	// ("abc" is the key abc).
	HeaderIdempotencyKey = idempotency.HeaderKey
	// HeaderReplayed is "true" on a response replayed from the first
	// request with the same Idempotency-Key.
	HeaderReplayed = idempotency.HeaderReplayed
	// HeaderRequestID carries the request's ID, echoed from the client if it
	// sent a sane one, else generated. It appears in the server's logs.
	HeaderRequestID = "X-Request-Id"
)

// Defaults of HandlerOpts.
const (
	DefaultMaxBodyBytes   = 64 << 10
	DefaultRequestTimeout = 5 * time.Second
	// ReleaseTimeout bounds the release of an Idempotency-Key after a
	// failed request, which runs on a fresh context.
	ReleaseTimeout = idempotency.ReleaseTimeout
	// RetryAfterSeconds is the Retry-After sent with 409
	// request_in_progress: the first request usually finishes in
	// milliseconds. A holder that died keeps the key for at most the
	// request lease.
	RetryAfterSeconds = idempotency.RetryAfterSeconds
)

// Route patterns, as they appear in the "route" metric label.
const (
	RouteCreateOrder = "POST /v1/orders"
	RouteGetOrder    = "GET /v1/orders/{id}"
	RouteHealthz     = "GET /healthz"
	RouteMetrics     = "GET /metrics"
)

// DB is what the Handler needs from Postgres. *pgxpool.Pool satisfies it.
type DB interface {
	effects.DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// HandlerOpts configures a Handler. A nil *HandlerOpts means all defaults.
type HandlerOpts struct {
	// Effects lists an order's effect records for GET. Nil means a client
	// on the Handler's db.
	Effects *effects.Client
	// Logger receives one access-log record per request (never the
	// Authorization header) and failures. Nil means slog.Default().
	Logger *slog.Logger
	// Metrics receives request counts, latencies and idempotency outcomes.
	// Nil means none.
	Metrics *Metrics
	// Gatherer, if set, is served at GET /metrics without authentication.
	// Leave it nil when metrics are served on a separate, private port.
	Gatherer prometheus.Gatherer
	// MaxBodyBytes caps a request body. Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// RequestLease is how long a request holds its Idempotency-Key. Zero
	// means DefaultRequestLease. It must exceed RequestTimeout.
	RequestLease time.Duration
	// RequestTimeout bounds the database work of one request, from the
	// Idempotency-Key claim to the commit (and each GET); a request that
	// runs out answers 503 unavailable with Retry-After. The work keeps
	// running when the client disconnects so that its retry finds the
	// response stored. Zero means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// RateLimit limits each tenant's requests to the /v1 routes (see
	// RateLimit). The zero value means no limit.
	RateLimit RateLimit
	// Starter, if set, lets POST /v1/orders and refunds honour Prefer:
	// wait=N: the handler starts the run (or joins it) with
	// Update-with-Start, with the options the relay's starts have, and
	// waits up to N seconds for the steps that decide the request. Nil
	// means the preference is ignored.
	Starter *temporalstart.Starter
	// MaxWait bounds Prefer: wait. Zero means DefaultMaxWait. The request
	// lease must exceed it plus twice the request timeout.
	MaxWait time.Duration
}

// Handler serves keyed's HTTP API:
//
//	POST /v1/orders                          create an order and queue its checkout (Idempotency-Key required)
//	GET  /v1/orders/{id}                     the order, its workflow start, each effect's key, state and outcome, and its refunds
//	POST /v1/orders/{id}/refunds             request a refund of a paid order and queue its run (Idempotency-Key required)
//	GET  /v1/orders/{id}/refunds/{refund_id} the refund: amount, state, Stripe refund ID, start and effects
//	GET  /healthz         200 when the database answers, else 503
//
// Every /v1 route needs "Authorization: Bearer <API key>"; the key decides
// the tenant. Errors are JSON: {"error":{"code":…,"field":…,"message":…}}.
type Handler struct {
	db      DB
	keys    *Keys
	store   *orders.Store
	effects *effects.Client
	idem    *idempotency.Middleware
	starter *temporalstart.Starter
	maxWait time.Duration
	logger  *slog.Logger
	metrics *Metrics
	maxBody int64
	timeout time.Duration
	routes  []route
	limiter *limiter
	mux     *http.ServeMux
	// refundTurns queues an order's refund requests in this process.
	refundTurns gates
}

// NewHandler returns a Handler over db, authenticating with keys. db must
// have keyed's migrations applied. It returns an error if db or keys is nil
// or an option is out of range.
func NewHandler(db DB, keys *Keys, opts *HandlerOpts) (*Handler, error) {
	if db == nil {
		return nil, errors.New("api: NewHandler: db is nil")
	}
	if keys == nil || len(keys.entries) == 0 {
		return nil, fmt.Errorf("api: NewHandler: %w", ErrNoKeys)
	}
	if opts == nil {
		opts = &HandlerOpts{}
	}
	h := &Handler{db: db, keys: keys, effects: opts.Effects, logger: opts.Logger, metrics: opts.Metrics,
		maxBody: opts.MaxBodyBytes, timeout: opts.RequestTimeout}
	lease := opts.RequestLease
	if lease == 0 {
		lease = DefaultRequestLease
	}
	if h.maxBody == 0 {
		h.maxBody = DefaultMaxBodyBytes
	}
	if h.timeout == 0 {
		h.timeout = DefaultRequestTimeout
	}
	switch {
	case h.maxBody < 1024:
		return nil, fmt.Errorf("api: NewHandler: max body %d bytes is under 1 KiB", h.maxBody)
	case h.timeout < 0:
		return nil, fmt.Errorf("api: NewHandler: request timeout %s is negative", h.timeout)
	case lease <= h.timeout:
		return nil, fmt.Errorf("api: NewHandler: request lease %s must exceed the request timeout %s", lease, h.timeout)
	case opts.MaxWait < 0:
		return nil, fmt.Errorf("api: NewHandler: max wait %s is negative", opts.MaxWait)
	}
	if h.starter = opts.Starter; h.starter != nil {
		h.maxWait = cmp.Or(opts.MaxWait, DefaultMaxWait)
		if lease <= 2*h.timeout+h.maxWait {
			return nil, fmt.Errorf("api: NewHandler: request lease %s must exceed twice the request timeout %s plus the max wait %s", lease, h.timeout, h.maxWait)
		}
	}
	if h.logger == nil {
		h.logger = slog.Default()
	}
	var err error
	if h.store, err = orders.NewStore(db); err != nil {
		return nil, fmt.Errorf("api: NewHandler: %w", err)
	}
	if h.effects == nil {
		if h.effects, err = effects.NewClient(db, &effects.ClientOpts{Logger: h.logger}); err != nil {
			return nil, fmt.Errorf("api: NewHandler: %w", err)
		}
	}
	if h.idem, err = h.newIdempotency(lease); err != nil {
		return nil, fmt.Errorf("api: NewHandler: %w", err)
	}
	if h.limiter, err = newLimiter(opts.RateLimit); err != nil {
		return nil, fmt.Errorf("api: NewHandler: %w", err)
	}

	h.routes = h.routeTable(opts.Gatherer)
	h.mux = http.NewServeMux()
	for _, rt := range h.routes {
		h.mux.Handle(rt.pattern, rt.handler)
	}
	return h, nil
}

// route is an entry of the Handler's route table: a ServeMux pattern and
// what serves it.
type route struct {
	pattern string
	handler http.Handler
}

// routeTable is every pattern the Handler serves. Tests derive their
// lists of routes from it (every route runs on a pool of one connection).
func (h *Handler) routeTable(gatherer prometheus.Gatherer) []route {
	rs := []route{
		{RouteCreateOrder, h.authed(h.idempotent(h.createOrder, h.orderRoute()))},
		{RouteGetOrder, h.authed(h.getOrder)},
		{RouteCreateRefund, h.authed(h.idempotent(h.createRefund, h.refundRoute()))},
		{RouteGetRefund, h.authed(h.getRefund)},
		{RouteHealthz, http.HandlerFunc(h.healthz)},
	}
	if gatherer != nil {
		rs = append(rs, route{RouteMetrics, promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{})},
			route{"/metrics", methodNotAllowed(allowGet)})
	}
	// Method-less patterns catch the other methods on the same paths, and
	// "/" everything else, so that every error is JSON.
	return append(rs,
		route{"/v1/orders", methodNotAllowed("POST")},
		route{"/v1/orders/{id}", methodNotAllowed(allowGet)},
		route{"/v1/orders/{id}/refunds", methodNotAllowed("POST")},
		route{"/v1/orders/{id}/refunds/{refund_id}", methodNotAllowed(allowGet)},
		route{"/healthz", methodNotAllowed(allowGet)},
		route{"/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeError(w, newError(http.StatusNotFound, CodeNotFound, "", "no route for %s %s", short(r.Method), short(r.URL.Path)))
		})},
	)
}

// allowGet is the Allow of a GET route: net/http's mux serves HEAD on it too.
const allowGet = "GET, HEAD"

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, newError(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "", "%s is not allowed here; use %s", short(r.Method), allow))
	}
}

type ctxKey int

const (
	tenantKey ctxKey = iota + 1
	requestIDKey
)

// ServeHTTP serves the API, recording metrics and an access-log record.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := r.Header.Get(HeaderRequestID)
	if !validRequestID(id) {
		id = randomID(8)
	}
	w.Header().Set(HeaderRequestID, id)
	var tenant string // set by authed, for the access log
	ctx := context.WithValue(r.Context(), requestIDKey, id)
	r = r.WithContext(context.WithValue(ctx, tenantKey, &tenant))
	sw := &idempotency.StatusWriter{ResponseWriter: w}
	h.serveRecovering(sw, r)
	if sw.Status == 0 {
		sw.Status = http.StatusOK
	}
	route := r.Pattern
	if route == "" || route == "/" || !strings.Contains(route, " ") {
		route = "other" // 404s and 405s: bounded label values
	}
	d := time.Since(start)
	h.metrics.request(route, sw.Status, d)
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		span.SetName(route)
		span.SetAttributes(attribute.String("http.route", route), attribute.String("keyed.tenant", tenant),
			attribute.String("keyed.request_id", id))
	}
	attrs := []slog.Attr{slog.String("request_id", id), slog.String("method", r.Method),
		slog.String("route", route), slog.Int("status", sw.Status), slog.Duration("duration", d)}
	if tenant != "" {
		attrs = append(attrs, slog.String("tenant", tenant))
	}
	if k := r.Header.Get(HeaderIdempotencyKey); k != "" && len(k) <= MaxIdempotencyKeyLen {
		attrs = append(attrs, slog.String("idempotency_key", k))
	}
	level := slog.LevelInfo
	if sw.Status >= 500 {
		level = slog.LevelError
	}
	h.logger.LogAttrs(r.Context(), level, "http request", attrs...)
}

// serveRecovering serves r, turning a panic into a logged 500 internal with
// a JSON body (net/http would drop the connection without an answer).
// http.ErrAbortHandler still aborts.
func (h *Handler) serveRecovering(w *idempotency.StatusWriter, r *http.Request) {
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		if p == http.ErrAbortHandler {
			panic(p)
		}
		h.logger.ErrorContext(r.Context(), "handler panic", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		if w.Status == 0 {
			writeError(w, newError(http.StatusInternalServerError, CodeInternal, "", "the server failed; retry (with the same Idempotency-Key for a POST)"))
		}
	}()
	if p := r.URL.EscapedPath(); r.Method != http.MethodConnect && !canonicalPath(p) {
		// ServeMux would answer a redirect in HTML, to a path it escapes twice.
		writeError(w, newError(http.StatusNotFound, CodeNotFound, "",
			"no route for %s %s: the path has an empty, \".\" or \"..\" segment", short(r.Method), short(r.URL.Path)))
		return
	}
	h.mux.ServeHTTP(w, r)
}

// canonicalPath reports whether p is as ServeMux routes it, without a
// redirect: rooted, no empty, "." or ".." segment but a trailing slash.
func canonicalPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean == p
}

func validRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// authed resolves the bearer API key to a tenant, or answers 401, and
// holds the tenant to its rate limit, or answers 429. The tenant comes from
// the key only, never from the request.
func (h *Handler) authed(next func(w http.ResponseWriter, r *http.Request, tenant string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := len(r.Header.Values("Authorization")); n > 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="keyed", error="invalid_request"`)
			writeError(w, newError(http.StatusUnauthorized, CodeUnauthorized, "", "send one Authorization header, not %d", n))
			return
		}
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		token = strings.TrimSpace(token)
		if !strings.EqualFold(scheme, "Bearer") || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="keyed"`)
			writeError(w, newError(http.StatusUnauthorized, CodeUnauthorized, "", "send your API key as Authorization: Bearer <key>"))
			return
		}
		tenant, ok := h.keys.Tenant(token)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="keyed", error="invalid_token"`)
			writeError(w, newError(http.StatusUnauthorized, CodeUnauthorized, "", "unknown API key"))
			return
		}
		// ServeHTTP reads the tenant back for the access log.
		if p, ok := r.Context().Value(tenantKey).(*string); ok {
			*p = tenant
		}
		if h.limited(w, tenant) {
			return
		}
		next(w, r, tenant)
	})
}

// createOrderRequest is the body of POST /v1/orders. Pointers tell a
// missing member from a zero one.
type createOrderRequest struct {
	OrderID       *string `json:"order_id"`
	AmountMinor   *int64  `json:"amount_minor"`
	Currency      *string `json:"currency"`
	CustomerEmail *string `json:"customer_email"`
	PaymentMethod *string `json:"payment_method"`
}

// OrderCreated is the body of a 201 or 200 answer to POST /v1/orders: 201
// when this request created the order, 200 when an identical order already
// existed. Its checkout is queued in the same transaction.
type OrderCreated struct {
	Order      *orders.Order `json:"order"`
	WorkflowID string        `json:"workflow_id"`
	// Charge is the charge's outcome in an answer that waited for it
	// (Prefer: wait); nil otherwise.
	Charge *ChargeView `json:"charge,omitempty"`
}

// OrderDetail is the body of GET /v1/orders/{id}.
type OrderDetail struct {
	Order      *orders.Order `json:"order"`
	WorkflowID string        `json:"workflow_id"`
	// Start is the state of the workflow start, or nil once its outbox row
	// was pruned.
	Start *StartView `json:"start,omitempty"`
	// Effects are the order's own effect records, in the order they were
	// first claimed; each refund's are in its RefundView, not repeated
	// here.
	Effects []EffectView `json:"effects"`
	// Refunds are the order's refunds, oldest request first.
	Refunds []RefundView `json:"refunds"`
	// RefundedMinor is what the order has refunded: the sum of its refunds
	// whose Stripe refund is recorded (state refunded), as its status
	// (partially_refunded, refunded) counts it. A refund in flight is not
	// in it yet.
	RefundedMinor int64 `json:"refunded_minor"`
	// ReservedMinor is what the order's refunds hold of its charge: those
	// in its ledger, in flight or refunded, less those released after
	// Stripe refused them. A new refund must fit in the order's amount
	// minus ReservedMinor.
	ReservedMinor int64 `json:"reserved_minor"`
}

// StartView is the workflow start of an order, from the outbox.
type StartView struct {
	// State is "queued" until the relay has started the workflow, then
	// "started".
	State    string `json:"state"`
	Attempts int    `json:"attempts"`
	// LastErrorCode is StartFailed while the last attempt to start the
	// workflow failed, and LastError a plain message saying so. The cause
	// (which names internal servers) goes to the relay's log and to
	// operator commands, never to the tenant.
	LastErrorCode string     `json:"last_error_code,omitempty"`
	LastError     string     `json:"last_error,omitempty"`
	RunID         string     `json:"run_id,omitempty"`
	QueuedAt      time.Time  `json:"queued_at"`
	StartedAt     *time.Time `json:"started_at,omitempty"`
}

// EffectView is one effect of an order: its key, state and stored outcome.
// A failed effect shows a stable ErrorCode (such as "card_declined",
// "transient" or "resolved_retry") and a plain Error message chosen by the
// code and state; the stored failure message, which may quote a provider
// or an operator's reason, goes to logs and operator commands only.
type EffectView struct {
	Key        string          `json:"key"`
	Kind       string          `json:"kind"`
	State      effects.State   `json:"state"`
	Outcome    json.RawMessage `json:"outcome,omitempty"`
	ErrorCode  string          `json:"error_code,omitempty"`
	Error      string          `json:"error,omitempty"`
	Attempts   int             `json:"attempts"`
	UpdatedAt  time.Time       `json:"updated_at"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
}

// idempotent serves f behind the Handler's Idempotency-Key middleware with
// the route's fingerprint and replay; f finds the decoded request in
// idempotency.FromContext(r.Context()).Value().
func (h *Handler) idempotent(f func(w http.ResponseWriter, r *http.Request, tenant string), ro *idempotency.RouteOpts) func(w http.ResponseWriter, r *http.Request, tenant string) {
	inner := h.idem.Route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f(w, r, tenantOf(r)) }), ro)
	return func(w http.ResponseWriter, r *http.Request, _ string) { inner.ServeHTTP(w, r) }
}

func (h *Handler) createOrder(w http.ResponseWriter, r *http.Request, tenant string) {
	q := idempotency.FromContext(r.Context())
	no := q.Value().(orders.NewOrder)
	if wait, ok := h.preferredWait(r); ok {
		h.createOrderWaiting(w, r, q, tenant, no, wait)
		return
	}
	resp, err := h.createTx(r.Context(), q, tenant, no)
	switch {
	case errors.Is(err, orders.ErrConflict):
		writeError(w, newError(http.StatusConflict, CodeOrderConflict, "order_id", "order %q exists with different details", no.ID))
	case err != nil:
		h.idem.Fail(w, r, "create order", err)
	default:
		resp.Write(w)
	}
}

// createTx writes the order, its outbox row and the stored response (its
// outcome, which the route's replay turns into the body) in one
// transaction: all of them or none.
func (h *Handler) createTx(ctx context.Context, q *idempotency.Request, tenant string, no orders.NewOrder) (idempotency.Response, error) {
	var resp idempotency.Response
	err := pgx.BeginFunc(ctx, h.db, func(tx pgx.Tx) error {
		order, created, err := h.store.CreateAndEnqueueTx(ctx, tx, no)
		if err != nil {
			return err
		}
		body, err := encodeBody(OrderCreated{Order: order, WorkflowID: orders.WorkflowID(tenant, order.ID)})
		if err != nil {
			return err
		}
		status := http.StatusOK
		if created {
			status = http.StatusCreated
		}
		if resp, err = responseOf(status, orderOutcomeOf(order), body); err != nil {
			return err
		}
		return q.CompleteTx(ctx, tx, resp)
	})
	return resp, err
}

// decodeStrict reads the body as one JSON object into a T whose members are
// exactly members: a body over the limit is 413, and an empty body, a
// member sent twice or in another case, an unknown member, data after the
// object, or text that is not UTF-8 (checkText) is 400.
func decodeStrict[T any](h *Handler, w http.ResponseWriter, r *http.Request, members []string) (T, *Error) {
	// The body is JSON whatever the Content-Type says: curl -d sends
	// application/x-www-form-urlencoded, and refusing it helps nobody.
	var req T
	if r.ContentLength > h.maxBody {
		return req, tooLarge(h.maxBody)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return req, tooLarge(h.maxBody)
		}
		return req, readError(err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return req, newError(http.StatusBadRequest, CodeInvalidJSON, "", "the body is empty; send a JSON object")
	}
	if bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
		return req, newError(http.StatusBadRequest, CodeInvalidJSON, "", "the body must be a JSON object, not null")
	}
	if aerr := checkMembers(body, members); aerr != nil {
		return req, aerr
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return req, newError(http.StatusBadRequest, CodeInvalidJSON, "", "unexpected data after the JSON object")
	}
	return req, checkText(body)
}

// decodeCreate reads one JSON object of known members, all present.
func (h *Handler) decodeCreate(w http.ResponseWriter, r *http.Request) (orders.NewOrder, *Error) {
	var no orders.NewOrder
	req, aerr := decodeStrict[createOrderRequest](h, w, r, createMembers)
	if aerr != nil {
		return no, aerr
	}
	for _, f := range []struct {
		name    string
		present bool
	}{
		{"order_id", req.OrderID != nil},
		{"amount_minor", req.AmountMinor != nil},
		{"currency", req.Currency != nil},
		{"customer_email", req.CustomerEmail != nil},
		{"payment_method", req.PaymentMethod != nil},
	} {
		if !f.present {
			return no, newError(http.StatusBadRequest, CodeMissingField, f.name, "%s is required", f.name)
		}
	}
	currency, err := orders.NormalizeCurrency(*req.Currency) // the rule starter create applies too
	if err != nil {
		var verr *orders.ValidationError
		if errors.As(err, &verr) {
			return no, newError(http.StatusBadRequest, CodeInvalidField, verr.Field, "%s", verr.Reason)
		}
		return no, newError(http.StatusBadRequest, CodeInvalidField, "currency", "%v", err)
	}
	no.ID, no.AmountMinor, no.Currency = *req.OrderID, *req.AmountMinor, currency
	no.CustomerEmail, no.PaymentMethod = *req.CustomerEmail, *req.PaymentMethod
	return no, nil
}

func tooLarge(limit int64) *Error {
	return newError(http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "", "the body is over the %d-byte limit", limit)
}

func jsonError(err error) *Error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return newError(http.StatusBadRequest, CodeInvalidJSON, "", "malformed JSON at byte %d: %v", syn.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return newError(http.StatusBadRequest, CodeInvalidJSON, "", "the JSON object is cut short")
	case errors.As(err, &typ) && typ.Field != "":
		return newError(http.StatusBadRequest, CodeInvalidField, typ.Field, "want a JSON %s, got %s", jsonKind(typ.Type.Kind().String()), short(typ.Value))
	case errors.As(err, &typ):
		return newError(http.StatusBadRequest, CodeInvalidJSON, "", "the body must be a JSON object, not %s", strings.Fields(typ.Value + " ")[0])
	}
	// encoding/json reports unknown members only as text.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		member, _ := strconv.Unquote(name)
		field, _ := idempotency.EchoCut(member)
		return newError(http.StatusBadRequest, CodeUnknownField, field, "%s is not a member of this request", echo(member))
	}
	return newError(http.StatusBadRequest, CodeInvalidJSON, "", "%v", err)
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int64":
		return "integer (minor units, such as 1999 for 19.99)"
	case "string":
		return "string"
	}
	return goKind
}

// requestHash is the fingerprint of a create request: the route and the
// validated order, in a fixed member order, so that member order and
// whitespace do not matter but every value does.
func requestHash(route string, no orders.NewOrder) string {
	canon, _ := json.Marshal(struct {
		Route         string `json:"route"`
		OrderID       string `json:"order_id"`
		AmountMinor   int64  `json:"amount_minor"`
		Currency      string `json:"currency"`
		CustomerEmail string `json:"customer_email"`
		PaymentMethod string `json:"payment_method"`
	}{route, no.ID, no.AmountMinor, no.Currency, no.CustomerEmail, no.PaymentMethod})
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:])
}

func (h *Handler) getOrder(w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	prefix, err := orders.OrderKey(tenant, id)
	if err != nil {
		writeError(w, newError(http.StatusBadRequest, CodeInvalidField, "id", "%s is not a valid order ID", echo(id)))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	var detail *OrderDetail
	err = h.readTx(ctx, func(tx pgx.Tx) error {
		var err error
		detail, err = h.orderDetail(ctx, tx, tenant, id, prefix)
		return err
	})
	if errors.Is(err, orders.ErrNotFound) {
		writeError(w, newError(http.StatusNotFound, CodeNotFound, "id", "no order %q", id))
		return
	}
	if err != nil {
		h.dbFailure(w, r, "get order", err)
		return
	}
	body, err := json.Marshal(detail)
	if err != nil {
		h.dbFailure(w, r, "encode order", err)
		return
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
}

// orderDetail reads the tenant's order id (prefix its effect key) and its
// start, effects and refunds through tx. It returns an error wrapping
// orders.ErrNotFound when there is no such order, and database errors.
func (h *Handler) orderDetail(ctx context.Context, tx pgx.Tx, tenant, id string, prefix effects.Key) (*OrderDetail, error) {
	order, err := h.store.GetTx(ctx, tx, tenant, id)
	if err != nil {
		return nil, err
	}
	detail := &OrderDetail{Order: order, WorkflowID: orders.WorkflowID(tenant, id), Effects: []EffectView{}}
	entry, err := outbox.Get(ctx, tx, detail.WorkflowID)
	switch {
	case err == nil:
		detail.Start = startView(entry)
		if entry.LastError != "" {
			h.logger.DebugContext(ctx, "order detail: start error withheld from the tenant",
				"workflow_id", entry.WorkflowID, "last_error", entry.LastError)
		}
	case !errors.Is(err, outbox.ErrNotFound):
		return nil, fmt.Errorf("get order start: %w", err)
	}
	recs, err := h.store.EffectsTx(ctx, tx, h.effects, prefix)
	if err != nil {
		return nil, fmt.Errorf("list order effects: %w", err)
	}
	for _, rec := range recs {
		if rec.ErrorMessage != "" {
			h.logger.DebugContext(ctx, "order detail: effect error withheld from the tenant",
				"effect_key", rec.Key, "code", rec.ErrorCode, "error", rec.ErrorMessage)
		}
	}
	own, err := h.orderRefunds(ctx, tx, order, recs, detail)
	if err != nil {
		return nil, fmt.Errorf("list order refunds: %w", err)
	}
	for _, rec := range own {
		detail.Effects = append(detail.Effects, effectView(rec))
	}
	return detail, nil
}

// readOnly are the options of a GET's transaction: one snapshot, no
// writes. A read-only transaction never fails to serialize.
var readOnly = pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}

// readTx runs fn in one read-only transaction: one connection and one
// snapshot for all of a GET's reads. A DB without BeginTx gets a transaction
// of its defaults.
func (h *Handler) readTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	if db, ok := h.db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		return pgx.BeginTxFunc(ctx, db, readOnly, fn)
	}
	return pgx.BeginFunc(ctx, h.db, fn)
}

func (h *Handler) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if _, err := h.db.Exec(ctx, "SELECT 1"); err != nil {
		h.logger.WarnContext(ctx, "health check: database unreachable", "error", err)
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
		writeError(w, newError(http.StatusServiceUnavailable, CodeUnavailable, "", "the database does not answer"))
		return
	}
	writeJSON(w, http.StatusOK, []byte(`{"status":"ok"}`+"\n"))
}

// dbFailure logs err and answers without revealing it: 503 unavailable
// with Retry-After when the database is down or did not answer in time
// (see unavailable), else 500 internal. Either way nothing was written.
func (h *Handler) dbFailure(w http.ResponseWriter, r *http.Request, what string, err error) {
	h.logger.ErrorContext(r.Context(), what, "error", err)
	if unavailable(err) {
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
		writeError(w, newError(http.StatusServiceUnavailable, CodeUnavailable, "", "%s: the database is unavailable; retry (with the same Idempotency-Key for a POST)", what))
		return
	}
	writeError(w, newError(http.StatusInternalServerError, CodeInternal, "", "%s failed; retry (with the same Idempotency-Key for a POST)", what))
}

// Prune deletes the Handler's expired idempotency records; see Prune.
func (h *Handler) Prune(ctx context.Context) (int64, error) {
	return h.idem.Prune(ctx)
}

// randomID returns 2n random lowercase letters and digits (n at most 13).
func randomID(n int) string {
	return strings.ToLower(rand.Text())[:2*n]
}
