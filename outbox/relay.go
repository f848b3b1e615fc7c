package outbox

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/tracing"
)

// Relay defaults. See RelayOpts.
const (
	DefaultBatchSize     = 100
	DefaultConcurrency   = 8
	DefaultPollInterval  = 250 * time.Millisecond
	DefaultLease         = 30 * time.Second
	DefaultStartTimeout  = 10 * time.Second
	DefaultRecordTimeout = 5 * time.Second
	DefaultMinBackoff    = 500 * time.Millisecond
	DefaultMaxBackoff    = time.Minute
	DefaultStatsInterval = 5 * time.Second
	DefaultPruneInterval = time.Hour
)

// ErrRunning is returned by Run and Start when the relay is already running.
var ErrRunning = errors.New("outbox relay already running")

// Started is what a Starter reports for one workflow start.
type Started struct {
	WorkflowID string
	RunID      string
	// Created is false when the workflow ID already had a run and the start
	// collapsed into it.
	Created bool
}

// Starter starts the workflow of one outbox row. It must start under
// req.WorkflowID so that a repeated start returns Created=false rather than an
// error, and be safe for concurrent use. The context carries the row's trace
// context and RelayOpts.StartTimeout. An error makes the relay retry the row
// with backoff.
type Starter interface {
	Start(ctx context.Context, req Request) (*Started, error)
}

// StarterFunc adapts a function to the Starter interface.
type StarterFunc func(ctx context.Context, req Request) (*Started, error)

// Start calls f.
func (f StarterFunc) Start(ctx context.Context, req Request) (*Started, error) {
	return f(ctx, req)
}

// RelayOpts configures a Relay. A nil *RelayOpts means all defaults.
type RelayOpts struct {
	// BatchSize is how many rows one claim takes at most. Zero means
	// DefaultBatchSize; at most 10,000.
	BatchSize int
	// Concurrency bounds the starts one relay has in flight at once. Run
	// claims only as many rows as it has free slots, and claims again once a
	// quarter of them (at least one) are free, marking the rows started
	// meanwhile in the same statement. Zero means DefaultConcurrency; at
	// most 1,000.
	Concurrency int
	// PollInterval is the wait between polls that found fewer rows than
	// they could take. Zero means DefaultPollInterval.
	PollInterval time.Duration
	// Lease is how long claimed rows stay invisible to other relays. A
	// relay that dies holding rows gives them back after it. Zero means
	// DefaultLease; it must be at least twice StartTimeout and at least
	// RecordTimeout.
	Lease time.Duration
	// StartTimeout bounds one workflow start. Zero means DefaultStartTimeout.
	StartTimeout time.Duration
	// RecordTimeout bounds each claim (with the marks it carries) and each
	// write that records rows' results (sent, rescheduled or given back).
	// A row's own write gets its own budget, counted from the end of its
	// own start, so a slow start never eats another row's budget. Zero
	// means DefaultRecordTimeout, or half the lease if that is shorter.
	RecordTimeout time.Duration
	// MinBackoff and MaxBackoff bound the exponential backoff, with full
	// jitter, applied to a row whose start failed and to the relay's next
	// claim after a failure. Zero means DefaultMinBackoff and
	// DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// StatsInterval is how often the relay refreshes the depth and age
	// gauges. Zero means DefaultStatsInterval.
	StatsInterval time.Duration
	// PruneInterval is how often the relay deletes sent rows older than
	// Retention. Zero means DefaultPruneInterval; negative never prunes.
	PruneInterval time.Duration
	// Retention is passed to Prune. Zero means DefaultRetention.
	Retention time.Duration
	// Name identifies the relay in claims and logs. Empty means
	// hostname-pid.
	Name string
	// Logger receives failures at Warn and batch summaries at Debug. Nil
	// means slog.Default().
	Logger *slog.Logger
	// Metrics receives the outbox gauges and counters. Nil means none.
	Metrics *Metrics
	// Wake, if set, makes the relay poll at once when it receives, instead
	// of waiting out PollInterval, and then for 10×NotifyWindow every
	// NotifyWindow (every quarter of it while looks find rows), for the
	// rows of enqueues that did not notify. Feed it from Listen.
	Wake <-chan struct{}
}

// Relay moves committed outbox rows to its Starter. It is safe to run
// several relays, in one process or many, over the same database: each row
// is claimed by one relay at a time. Run it with Run, or with Start and Stop
// from an fx lifecycle.
type Relay struct {
	db      effects.DB
	starter Starter
	batch   int
	conc    int
	poll    time.Duration
	lease   time.Duration
	timeout time.Duration
	record  time.Duration
	minBack time.Duration
	maxBack time.Duration
	statsIv time.Duration
	pruneIv time.Duration
	retain  time.Duration
	name    string
	logger  *slog.Logger
	metrics *Metrics
	wake    <-chan struct{}
	// claimSQL is the claim statement: claimSQL, or in tests the FIFO
	// claim of old, their baseline (export_test.go).
	claimSQL string
	// markEach makes Run mark each row as its start returns and claim
	// again as soon as one slot is free, as it did before it marked with
	// its claims: the baseline of BenchmarkRelayDrain (export_test.go).
	markEach bool

	mu      sync.Mutex
	running bool
	cancel  context.CancelFunc
	done    chan struct{}

	// unmarked holds rows whose start succeeded and that are not marked
	// sent yet: in Run, every start's until the next claim or wait marks
	// it; in Poll, those whose mark failed, which the next pass marks
	// before claiming more.
	unmarkedMu sync.Mutex
	unmarked   []unmarked
}

// unmarked is a row started under this relay's claim but not yet marked
// sent.
type unmarked struct {
	id         int64
	workflowID string
	runID      string
	// leaseEnd is when another relay may claim the row again; after it,
	// that relay's start collapses and marks the row itself.
	leaseEnd time.Time
}

// NewRelay returns a Relay that claims rows from db and starts them with
// starter. It returns an error if db or starter is nil or an option is out of
// range.
func NewRelay(db effects.DB, starter Starter, opts *RelayOpts) (*Relay, error) {
	if db == nil {
		return nil, errors.New("outbox: NewRelay: db is nil")
	}
	if starter == nil {
		return nil, errors.New("outbox: NewRelay: starter is nil")
	}
	if opts == nil {
		opts = &RelayOpts{}
	}
	r := &Relay{
		db: db, starter: starter,
		batch:   orDefault(opts.BatchSize, DefaultBatchSize),
		conc:    orDefault(opts.Concurrency, DefaultConcurrency),
		poll:    orDefault(opts.PollInterval, DefaultPollInterval),
		lease:   orDefault(opts.Lease, DefaultLease),
		timeout: orDefault(opts.StartTimeout, DefaultStartTimeout),
		record:  opts.RecordTimeout,
		minBack: orDefault(opts.MinBackoff, DefaultMinBackoff),
		maxBack: orDefault(opts.MaxBackoff, DefaultMaxBackoff),
		statsIv: orDefault(opts.StatsInterval, DefaultStatsInterval),
		pruneIv: orDefault(opts.PruneInterval, DefaultPruneInterval),
		retain:  orDefault(opts.Retention, DefaultRetention),
		name:    opts.Name,
		logger:  opts.Logger,
		metrics: opts.Metrics,
		wake:    opts.Wake,

		claimSQL: claimSQL,
	}
	if r.record == 0 {
		r.record = min(DefaultRecordTimeout, r.lease/2)
	}
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("outbox: NewRelay: %w", err)
	}
	if r.name == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "relay" // the name only tells relays apart in logs and claims
		}
		r.name = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if r.logger == nil {
		r.logger = slog.Default()
	}
	r.logger = r.logger.With("relay", r.name)
	return r, nil
}

func (r *Relay) validate() error {
	switch {
	case r.batch < 0 || r.batch > 10_000:
		return fmt.Errorf("batch size %d is outside 1..10000", r.batch)
	case r.conc < 0 || r.conc > 1000:
		return fmt.Errorf("concurrency %d is outside 1..1000", r.conc)
	case r.poll < 0 || r.timeout < 0 || r.record < 0 || r.minBack < 0 || r.maxBack < 0 || r.statsIv < 0:
		return errors.New("negative interval")
	case r.lease < time.Second:
		return fmt.Errorf("lease %s is shorter than one second", r.lease)
	case r.lease < 2*r.timeout:
		return fmt.Errorf("lease %s is shorter than twice the start timeout %s", r.lease, r.timeout)
	case r.lease < r.record:
		return fmt.Errorf("lease %s is shorter than the record timeout %s", r.lease, r.record)
	case r.minBack > r.maxBack:
		return fmt.Errorf("min backoff %s exceeds max backoff %s", r.minBack, r.maxBack)
	case r.pruneIv > 0 && r.retain < time.Hour:
		return fmt.Errorf("retention %s is under one hour", r.retain)
	}
	return nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Name returns the relay's name, as recorded in claimed rows.
func (r *Relay) Name() string { return r.name }

// Run claims and starts due rows until ctx is done and then returns nil,
// after the starts in flight have finished or been cancelled. It never
// returns early on a database or Temporal error: it logs it and backs off.
// It returns ErrRunning if the relay is already running.
func (r *Relay) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return ErrRunning
	}
	r.running = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running = false
		r.mu.Unlock()
	}()
	r.run(ctx)
	return nil
}

// loop is the state of one run: the starts in flight and the failures in a
// row.
type loop struct {
	r        *Relay
	done     chan error
	wg       sync.WaitGroup
	inflight int
	failures int
	// trailUntil ends the short waits that follow a wake-up.
	trailUntil time.Time
	// Housekeeping times.
	lastStats, lastPrune time.Time
}

func (r *Relay) run(ctx context.Context) {
	r.logger.InfoContext(ctx, "outbox relay started", "batch_size", r.batch, "concurrency", r.conc, "poll_interval", r.poll)
	l := &loop{r: r, done: make(chan error, r.conc)}
	defer func() {
		l.wg.Wait()
		if _, err := r.flushUnmarked(context.WithoutCancel(ctx)); err != nil {
			r.logger.Warn("mark started outbox rows sent; they are marked when their lease runs out", "error", err)
		}
		r.logger.Info("outbox relay stopped")
	}()
	for ctx.Err() == nil {
		if l.drain(ctx) {
			// A start failed while the relay was busy claiming: back
			// off before claiming more.
			if !l.wait(ctx, pause{d: r.backoff(l.failures)}) {
				return
			}
			continue
		}
		limit := min(r.batch, r.conc-l.inflight)
		n, err := l.dispatch(ctx, limit)
		if ctx.Err() != nil {
			return
		}
		l.housekeeping(ctx)
		w := pause{d: r.poll, wake: r.wake}
		if time.Now().Before(l.trailUntil) {
			// Enqueues in the waking one's NotifyWindow did not notify:
			// look again as they commit, sooner while looks find rows.
			w.d = min(w.d, trailWait(n))
		}
		switch {
		case err != nil:
			l.failures++
			w = pause{d: r.backoff(l.failures)}
			r.logger.WarnContext(ctx, "outbox poll failed; backing off", "error", err, "failures", l.failures, "wait", w.d)
		case limit > 0 && n == limit && l.inflight < r.conc:
			continue // more may be due right now
		case l.inflight >= r.conc:
			w = pause{d: r.poll, forSlot: true} // claim again as soon as a start finishes
		case n == 0 && l.inflight == 0:
			l.failures = 0 // nothing due: failed rows back off on their own
		}
		if !l.wait(ctx, w) {
			return
		}
	}
}

// trailWait is how long a woken relay waits before its next look, after
// a look that claimed n rows: NotifyWindow after an empty look, a quarter
// of it while rows keep committing, so that a steady stream of enqueues
// that did not notify starts within milliseconds, not in bursts a window
// apart, without more empty looks when the stream ends.
func trailWait(n int) time.Duration {
	if n > 0 {
		return NotifyWindow / 4
	}
	return NotifyWindow
}

// pause describes what ends the loop's wait: the timer, a wake-up (nil
// while backing off), or, with forSlot, the end of a start in flight.
type pause struct {
	d       time.Duration
	wake    <-chan struct{}
	forSlot bool
}

// wait blocks until w ends, recording the starts that finish meanwhile; a
// failed start turns the wait into a backoff. A wait for slots ends once
// refill of them are free; any other marks the started rows first, and
// each row as its start finishes. It returns false when ctx is done.
func (l *loop) wait(ctx context.Context, w pause) bool {
	if !w.forSlot {
		l.markStarted(ctx)
	}
	t := time.NewTimer(w.d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-w.wake:
			l.trailUntil = time.Now().Add(10 * NotifyWindow)
			return true
		case err := <-l.done:
			l.finished(ctx, err)
			switch {
			case err != nil:
				// Back off from the failure, whatever the wait was for.
				t.Reset(l.r.backoff(l.failures))
				w.wake, w.forSlot = nil, false
			case w.forSlot:
				if l.r.conc-l.inflight >= l.r.refill() {
					return true
				}
			default:
				l.markStarted(ctx)
			}
		}
	}
}

// drain records the starts that have finished, without waiting, and
// reports whether one of them failed.
func (l *loop) drain(ctx context.Context) (failed bool) {
	for {
		select {
		case err := <-l.done:
			l.finished(ctx, err)
			failed = failed || err != nil
		default:
			return failed
		}
	}
}

// markStarted marks the rows started and not yet marked; a failure keeps
// them for the next claim.
func (l *loop) markStarted(ctx context.Context) {
	if _, err := l.r.flushUnmarked(ctx); err != nil {
		l.r.logger.WarnContext(ctx, "mark started outbox rows sent; the next claim marks them", "error", err)
	}
}

// refill is how many free slots make Run claim again: a quarter of them,
// so that one claim, and the marks it carries, serves several starts.
func (r *Relay) refill() int {
	if r.markEach {
		return 1
	}
	return max(1, r.conc/4)
}

func (l *loop) finished(ctx context.Context, err error) {
	l.inflight--
	if err == nil {
		l.failures = 0
		return
	}
	l.failures++
	l.r.logger.WarnContext(ctx, "outbox start failed; backing off", "error", err, "failures", l.failures)
}

// dispatch claims up to limit due rows, marking the rows started since the
// last claim in the same statement, and starts each in its own goroutine,
// which reports on l.done. It returns how many rows it claimed. With no
// free slot it only marks.
func (l *loop) dispatch(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		l.markStarted(ctx)
		return 0, nil
	}
	marks := l.r.takeUnmarked()
	batch, err := l.r.claim(ctx, limit, marks)
	if err != nil {
		l.r.keepUnmarked(marks)
		return 0, err
	}
	for _, c := range batch {
		l.inflight++
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			_, err := l.r.handle(ctx, c, l.r.markEach)
			l.done <- err
		}()
	}
	return len(batch), nil
}

func (l *loop) housekeeping(ctx context.Context) {
	r := l.r
	if time.Since(l.lastStats) >= r.statsIv {
		r.refreshStats(ctx)
		l.lastStats = time.Now()
	}
	if r.pruneIv > 0 && time.Since(l.lastPrune) >= r.pruneIv {
		r.prune(ctx)
		l.lastPrune = time.Now()
	}
}

func (r *Relay) refreshStats(ctx context.Context) {
	if r.metrics == nil {
		return
	}
	s, err := ReadStats(ctx, r.db)
	if err != nil {
		r.logger.WarnContext(ctx, "read outbox stats", "error", err)
		return
	}
	r.metrics.stats(s)
}

func (r *Relay) prune(ctx context.Context) {
	n, err := Prune(ctx, r.db, &PruneOpts{Retention: r.retain})
	if err != nil {
		r.logger.WarnContext(ctx, "prune outbox", "error", err)
		return
	}
	if n > 0 {
		r.logger.InfoContext(ctx, "pruned sent outbox rows", "rows", n, "retention", r.retain)
	}
}

// Start runs the relay in the background until Stop, and returns at once,
// as an fx OnStart hook must. It ignores ctx's cancellation, which in fx
// only bounds the start itself. It returns ErrRunning if the relay is
// already running.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		return ErrRunning
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.running, r.cancel, r.done = true, cancel, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		r.run(runCtx)
		r.mu.Lock()
		r.running = false
		r.mu.Unlock()
	}(r.done)
	return nil
}

// Stop stops a relay started with Start and waits for its starts in flight
// to finish or be cancelled; a row whose start was cancelled is given back
// at once. It returns ctx's error if ctx ends first, and nil if the relay
// was not started.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.cancel, r.done = nil, nil
	r.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop outbox relay: %w", ctx.Err())
	}
}

// claimed is one outbox row claimed by a poll.
type claimed struct {
	id       int64
	req      Request
	attempts int
	// round is the row's round (see "Fairness" in the package doc).
	round int64
	// traceContext is the enqueueing request's trace context, nil when
	// it had none (see internal/tracing).
	traceContext []byte
	// age is the row's age when claimed; claimedAt is when, on this
	// process's clock; token is the claim's.
	age       time.Duration
	claimedAt time.Time
	token     string
}

// claimSQL leases up to $1 due rows for $2 microseconds to claim token $3,
// round-robin across tenants (by round, then due time); the index scan stops
// after the batch and SKIP LOCKED keeps concurrent relays apart.
const claimSQL = `
UPDATE keyed_outbox o
SET available_at = now() + $2 * interval '1 microsecond', attempts = o.attempts + 1, claimed_by = $3
FROM (
	SELECT id FROM keyed_outbox
	WHERE sent_at IS NULL AND available_at <= now()
	ORDER BY fair_round, available_at, id
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) due
WHERE o.id = due.id
RETURNING ` + claimColumns

// claimColumns are what a claim returns of each row, as claim scans them.
const claimColumns = `o.id, o.workflow_type, o.workflow_id, coalesce(o.task_queue, ''), o.payload, coalesce(o.tenant_id, ''), o.meta,
	o.attempts, o.trace_context, o.fair_round,
	(extract(epoch FROM clock_timestamp() - o.created_at) * 1000000)::bigint`

// markSQL marks started rows sent, their IDs and run IDs in the arrays
// $%[1]d and $%[2]d.
const markSQL = `
UPDATE keyed_outbox o
SET sent_at = now(), run_id = v.run_id, claimed_by = NULL, last_error = NULL
FROM unnest($%[1]d::bigint[], $%[2]d::text[]) AS v(id, run_id)
WHERE o.id = v.id AND o.sent_at IS NULL`

var (
	// markRowsSQL marks rows sent on their own.
	markRowsSQL = fmt.Sprintf(markSQL, 1, 2)
	// markingClaim prefixes a claim with the marks of rows started under
	// earlier claims ($4, $5). Those rows are leased to this relay, so the
	// claim cannot take them; one whose lease ran out by the database's
	// clock and that the claim takes anyway is updated once, by the claim,
	// and its new start collapses and marks it.
	markingClaim = "WITH marked AS (" + fmt.Sprintf(markSQL, 4, 5) + ")"
)

// claim leases up to limit due rows to this relay, in the claim's order
// (round, then id), within the record timeout, and marks the rows of marks
// sent in the same statement.
func (r *Relay) claim(ctx context.Context, limit int, marks []unmarked) ([]claimed, error) {
	token := r.name + "/" + randomID(6)
	claimedAt := time.Now()
	// A stalled database must not stall the relay: the claim is bounded
	// like a record, and a timed-out claim leaves at most a lease behind.
	ctx, cancel := context.WithTimeout(ctx, r.record)
	defer cancel()
	sql, args := r.claimSQL, []any{limit, r.lease.Microseconds(), token}
	if len(marks) > 0 {
		ids, runIDs := markArgs(marks)
		sql, args = markingClaim+sql, append(args, ids, runIDs)
	}
	rows, err := r.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	defer rows.Close()
	var batch []claimed
	for rows.Next() {
		c := claimed{claimedAt: claimedAt, token: token}
		var ageMicros int64
		q := &c.req
		if err := rows.Scan(&c.id, &q.WorkflowType, &q.WorkflowID, &q.TaskQueue, &q.Payload, &q.TenantID, &q.Meta,
			&c.attempts, &c.traceContext, &c.round, &ageMicros); err != nil {
			return nil, fmt.Errorf("claim outbox rows: %w", err)
		}
		c.age = time.Duration(ageMicros) * time.Microsecond
		batch = append(batch, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	// RETURNING keeps no order: restore the claim's, which Poll starts in.
	slices.SortFunc(batch, func(a, b claimed) int { return cmp.Or(cmp.Compare(a.round, b.round), cmp.Compare(a.id, b.id)) })
	return batch, nil
}

// Poll marks the rows a previous pass started but could not mark, claims one
// batch, starts it (up to Concurrency at once) and marks each row as its start
// returns; it returns how many rows it marked. A failed start reschedules its
// row, gives the rest back and returns the error; a failed mark keeps the row
// for the next pass and returns that error. Poll is for tests and callers
// with their own loop.
func (r *Relay) Poll(ctx context.Context) (int, error) {
	flushed, err := r.flushUnmarked(ctx)
	if err != nil {
		return 0, err
	}
	batch, err := r.claim(ctx, r.batch, nil)
	if err != nil {
		return flushed, err
	}
	if len(batch) == 0 {
		return flushed, nil
	}
	// Stop starting before the lease runs out, so that no other relay
	// claims a row this one is still starting.
	deadline := batch[0].claimedAt.Add(r.lease - r.timeout)
	var (
		mu   sync.Mutex
		sent int
		errs []error
		wg   sync.WaitGroup
	)
	slots := make(chan struct{}, r.conc)
	halt := false
	for i, c := range batch {
		slots <- struct{}{}
		mu.Lock()
		stop := halt
		mu.Unlock()
		if stop || ctx.Err() != nil || time.Now().After(deadline) {
			<-slots
			r.release(ctx, batch[i:])
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			ok, err := r.handle(ctx, c, true)
			mu.Lock()
			defer mu.Unlock()
			if ok {
				sent++
			}
			if err != nil {
				errs = append(errs, err)
			}
			// A failed start stops the batch; a failed mark does not:
			// the row is remembered, and starting the others is safe.
			halt = halt || (err != nil && !errors.As(err, new(*unmarkedError)))
		}()
	}
	wg.Wait()
	if sent > 0 {
		r.logger.DebugContext(ctx, "outbox rows sent", "rows", sent)
	}
	return flushed + sent, errors.Join(errs...)
}

// handle starts one claimed row and records the result with a budget of its
// own. With markNow it marks the row sent and reports whether it did;
// otherwise it leaves the row to be marked with the relay's next claim
// (Run) and reports true. It returns the start's error, or the mark's (the
// row is then kept for the next pass).
func (r *Relay) handle(ctx context.Context, c claimed, markNow bool) (bool, error) {
	st, err := r.startOne(ctx, c)
	rec, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.record)
	defer cancel()
	if err != nil {
		if ctx.Err() != nil {
			r.release(rec, []claimed{c})
			return false, nil
		}
		r.metrics.failed()
		r.reschedule(rec, c, err)
		return false, fmt.Errorf("start %s: %w", c.req.WorkflowID, err)
	}
	r.metrics.started(st.Created, c.age+time.Since(c.claimedAt))
	if !markNow {
		r.remember(unmarked{id: c.id, workflowID: c.req.WorkflowID, runID: st.RunID, leaseEnd: c.claimedAt.Add(r.lease)})
		return true, nil
	}
	_, err = r.db.Exec(rec, `
UPDATE keyed_outbox SET sent_at = now(), run_id = $2, claimed_by = NULL, last_error = NULL
WHERE id = $1 AND sent_at IS NULL`, c.id, st.RunID)
	if err != nil {
		r.remember(unmarked{id: c.id, workflowID: c.req.WorkflowID, runID: st.RunID, leaseEnd: c.claimedAt.Add(r.lease)})
		return false, &unmarkedError{workflowID: c.req.WorkflowID, runID: st.RunID, err: err}
	}
	return true, nil
}

// unmarkedError is handle's error for a row whose workflow started but
// whose mark failed.
type unmarkedError struct {
	workflowID, runID string
	err               error
}

func (e *unmarkedError) Error() string {
	return fmt.Sprintf("mark %s sent (started as run %s; the next pass marks it): %v", e.workflowID, e.runID, e.err)
}

func (e *unmarkedError) Unwrap() error { return e.err }

// startOne hands c's request to the Starter within the start timeout and
// the enqueueing request's trace.
func (r *Relay) startOne(ctx context.Context, c claimed) (*Started, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	// The start joins the trace of the request that enqueued the row.
	ctx = tracing.Extract(ctx, c.traceContext)
	st, err := r.starter.Start(ctx, c.req)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return nil, errors.New("starter returned no result")
	}
	return st, nil
}

func (r *Relay) remember(u unmarked) {
	r.unmarkedMu.Lock()
	defer r.unmarkedMu.Unlock()
	r.unmarked = append(r.unmarked, u)
}

// flushUnmarked marks sent, in one statement, the rows this relay started but
// has not marked, and returns how many; a row whose lease ran out is left to
// its next claimer. On failure the rows are kept and the error is returned.
func (r *Relay) flushUnmarked(ctx context.Context) (int, error) {
	pending := r.takeUnmarked()
	if len(pending) == 0 {
		return 0, nil
	}
	ids, runIDs := markArgs(pending)
	rec, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.record)
	defer cancel()
	tag, err := r.db.Exec(rec, markRowsSQL, ids, runIDs)
	if err != nil {
		r.keepUnmarked(pending)
		return 0, fmt.Errorf("mark %d started outbox rows sent: %w", len(ids), err)
	}
	return int(tag.RowsAffected()), nil
}

// takeUnmarked hands over the rows to mark, without those whose lease ran
// out (their next claimer marks them).
func (r *Relay) takeUnmarked() []unmarked {
	r.unmarkedMu.Lock()
	pending := r.unmarked
	r.unmarked = nil
	r.unmarkedMu.Unlock()
	now := time.Now()
	return slices.DeleteFunc(pending, func(u unmarked) bool { return now.After(u.leaseEnd) })
}

// keepUnmarked gives back rows whose mark failed.
func (r *Relay) keepUnmarked(pending []unmarked) {
	if len(pending) == 0 {
		return
	}
	r.unmarkedMu.Lock()
	defer r.unmarkedMu.Unlock()
	r.unmarked = append(r.unmarked, pending...)
}

// markArgs returns the IDs and run IDs of rows, for markSQL.
func markArgs(rows []unmarked) ([]int64, []string) {
	ids := make([]int64, len(rows))
	runIDs := make([]string, len(rows))
	for i, u := range rows {
		ids[i], runIDs[i] = u.id, u.runID
	}
	return ids, runIDs
}

// reschedule pushes a failed row back by a jittered backoff that grows with
// its attempts.
func (r *Relay) reschedule(ctx context.Context, c claimed, cause error) {
	wait := r.backoff(c.attempts)
	msg := cause.Error()
	if len(msg) > 512 {
		msg = msg[:512]
	}
	r.logger.WarnContext(ctx, "workflow start failed; will retry", "workflow_id", c.req.WorkflowID, "workflow_type", c.req.WorkflowType,
		"attempt", c.attempts, "retry_in", wait, "error", cause)
	if _, err := r.db.Exec(ctx, `
UPDATE keyed_outbox SET available_at = now() + $3 * interval '1 microsecond', last_error = $4, claimed_by = NULL
WHERE id = $1 AND claimed_by = $2 AND sent_at IS NULL`, c.id, c.token, wait.Microseconds(), msg); err != nil {
		r.logger.WarnContext(ctx, "reschedule outbox row; it returns when its lease runs out",
			"workflow_id", c.req.WorkflowID, "error", err)
	}
}

// release gives claimed rows back for immediate claiming, without counting
// the claim as an attempt. It writes with a budget of its own, since ctx
// may be the one that ended.
func (r *Relay) release(ctx context.Context, rows []claimed) {
	if len(rows) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.record)
	defer cancel()
	ids := make([]int64, len(rows))
	for i, c := range rows {
		ids[i] = c.id
	}
	if _, err := r.db.Exec(ctx, `
UPDATE keyed_outbox SET available_at = now(), attempts = greatest(attempts - 1, 0), claimed_by = NULL
WHERE id = ANY($1) AND claimed_by = $2 AND sent_at IS NULL`, ids, rows[0].token); err != nil {
		r.logger.WarnContext(ctx, "release outbox rows; they return when their lease runs out", "rows", len(ids), "error", err)
	}
}

// backoff returns a delay drawn uniformly from [0, min(max, min·2^(n-1))]:
// exponential backoff with full jitter, so that relays retrying together
// spread out instead of arriving in waves.
func (r *Relay) backoff(n int) time.Duration {
	ceiling := r.maxBack
	if n < 1 {
		n = 1
	}
	if n <= 32 {
		if d := r.minBack << (n - 1); d > 0 && d < ceiling {
			ceiling = d
		}
	}
	if ceiling <= 0 {
		return 0
	}
	return rand.N(ceiling + 1)
}

// randomID returns 2n random lowercase letters and digits (n at most 13).
func randomID(n int) string {
	return strings.ToLower(crand.Text())[:2*n]
}
