package outbox

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
)

// Relay defaults. See RelayOpts.
const (
	DefaultBatchSize     = 100
	DefaultPollInterval  = 250 * time.Millisecond
	DefaultLease         = 30 * time.Second
	DefaultStartTimeout  = 10 * time.Second
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

// Starter starts the checkout workflow for one outbox row. It must start
// under in.WorkflowID() so that a repeated start collapses into the first
// run and returns Created=false rather than an error. TemporalStarter is the
// production implementation; tests wrap it to count or fail starts.
type Starter interface {
	Start(ctx context.Context, in orders.CheckoutInput) (*Started, error)
}

// StarterFunc adapts a function to the Starter interface.
type StarterFunc func(ctx context.Context, in orders.CheckoutInput) (*Started, error)

// Start calls f.
func (f StarterFunc) Start(ctx context.Context, in orders.CheckoutInput) (*Started, error) {
	return f(ctx, in)
}

// RelayOpts configures a Relay. A nil *RelayOpts means all defaults.
type RelayOpts struct {
	// BatchSize is how many rows one poll claims. Zero means
	// DefaultBatchSize; at most 10,000.
	BatchSize int
	// PollInterval is the wait between polls that found fewer rows than a
	// full batch. Zero means DefaultPollInterval.
	PollInterval time.Duration
	// Lease is how long claimed rows stay invisible to other relays. A
	// relay that dies holding rows gives them back after it. Zero means
	// DefaultLease; it must be at least twice StartTimeout.
	Lease time.Duration
	// StartTimeout bounds one workflow start. Zero means DefaultStartTimeout.
	StartTimeout time.Duration
	// MinBackoff and MaxBackoff bound the exponential backoff, with full
	// jitter, applied to a row whose start failed and to the relay's next
	// poll after a failure. Zero means DefaultMinBackoff and
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
	// of waiting out PollInterval. Feed it from Listen.
	Wake <-chan struct{}
}

// Relay moves committed outbox rows to Temporal. It is safe to run several
// relays, in one process or many, over the same database: each row is
// claimed by one relay at a time. Run it with Run, or with Start and Stop
// from an fx lifecycle.
type Relay struct {
	db      effects.DB
	starter Starter
	batch   int
	poll    time.Duration
	lease   time.Duration
	timeout time.Duration
	minBack time.Duration
	maxBack time.Duration
	statsIv time.Duration
	pruneIv time.Duration
	retain  time.Duration
	name    string
	logger  *slog.Logger
	metrics *Metrics
	wake    <-chan struct{}

	mu      sync.Mutex
	running bool
	cancel  context.CancelFunc
	done    chan struct{}
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
		poll:    orDefault(opts.PollInterval, DefaultPollInterval),
		lease:   orDefault(opts.Lease, DefaultLease),
		timeout: orDefault(opts.StartTimeout, DefaultStartTimeout),
		minBack: orDefault(opts.MinBackoff, DefaultMinBackoff),
		maxBack: orDefault(opts.MaxBackoff, DefaultMaxBackoff),
		statsIv: orDefault(opts.StatsInterval, DefaultStatsInterval),
		pruneIv: orDefault(opts.PruneInterval, DefaultPruneInterval),
		retain:  orDefault(opts.Retention, DefaultRetention),
		name:    opts.Name,
		logger:  opts.Logger,
		metrics: opts.Metrics,
		wake:    opts.Wake,
	}
	switch {
	case r.batch < 0 || r.batch > 10_000:
		return nil, fmt.Errorf("outbox: NewRelay: batch size %d is outside 1..10000", r.batch)
	case r.poll < 0 || r.timeout < 0 || r.minBack < 0 || r.maxBack < 0 || r.statsIv < 0:
		return nil, errors.New("outbox: NewRelay: negative interval")
	case r.lease < time.Second:
		return nil, fmt.Errorf("outbox: NewRelay: lease %s is shorter than one second", r.lease)
	case r.lease < 2*r.timeout:
		return nil, fmt.Errorf("outbox: NewRelay: lease %s is shorter than twice the start timeout %s", r.lease, r.timeout)
	case r.minBack > r.maxBack:
		return nil, fmt.Errorf("outbox: NewRelay: min backoff %s exceeds max backoff %s", r.minBack, r.maxBack)
	case r.pruneIv > 0 && r.retain < time.Hour:
		return nil, fmt.Errorf("outbox: NewRelay: retention %s is under one hour", r.retain)
	}
	if r.name == "" {
		host, _ := os.Hostname()
		r.name = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if r.logger == nil {
		r.logger = slog.Default()
	}
	r.logger = r.logger.With("relay", r.name)
	return r, nil
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

// Run polls the outbox until ctx is done and then returns nil. It never
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

func (r *Relay) run(ctx context.Context) {
	r.logger.InfoContext(ctx, "outbox relay started", "batch_size", r.batch, "poll_interval", r.poll)
	defer r.logger.Info("outbox relay stopped")
	var failures int
	var lastStats, lastPrune time.Time
	for ctx.Err() == nil {
		n, err := r.Poll(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(lastStats) >= r.statsIv {
			r.refreshStats(ctx)
			lastStats = time.Now()
		}
		if r.pruneIv > 0 && time.Since(lastPrune) >= r.pruneIv {
			r.prune(ctx)
			lastPrune = time.Now()
		}
		var wait time.Duration
		switch {
		case err != nil:
			failures++
			wait = r.backoff(failures)
			r.logger.WarnContext(ctx, "outbox poll failed; backing off", "error", err, "failures", failures, "wait", wait)
		case n >= r.batch:
			failures = 0
			continue // more may be due right now
		default:
			failures = 0
			wait = r.poll
		}
		// A commit that enqueued a row wakes the relay early, except while
		// it backs off from a failure.
		wake := r.wake
		if err != nil {
			wake = nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-wake:
			t.Stop()
		}
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

// Stop stops a relay started with Start and waits for its current batch to
// finish; rows it claimed but did not start are given back at once. It
// returns ctx's error if ctx ends first, and nil if the relay was not
// started.
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
	id         int64
	workflowID string
	payload    []byte
	attempts   int
	age        time.Duration
}

const claimSQL = `
UPDATE keyed_outbox o
SET available_at = now() + $2 * interval '1 microsecond', attempts = o.attempts + 1, claimed_by = $3
FROM (
	SELECT id FROM keyed_outbox
	WHERE sent_at IS NULL AND available_at <= now()
	ORDER BY available_at, id
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) due
WHERE o.id = due.id
RETURNING o.id, o.workflow_id, o.payload, o.attempts,
	(extract(epoch FROM clock_timestamp() - o.created_at) * 1000000)::bigint`

// Poll claims one batch of due rows, starts their workflows and marks them
// sent, and returns how many it sent. A failed start reschedules its row
// with a jittered backoff, gives the rest of the batch back and returns the
// start's error; Run then backs off before polling again. When ctx ends
// mid-batch, the rows not yet started are given back. Poll is for tests and
// for callers with their own loop; Run calls it.
func (r *Relay) Poll(ctx context.Context) (int, error) {
	token := r.name + "/" + randomHex(6)
	claimedAt := time.Now()
	rows, err := r.db.Query(ctx, claimSQL, r.batch, r.lease.Microseconds(), token)
	if err != nil {
		return 0, fmt.Errorf("claim outbox rows: %w", err)
	}
	var batch []claimed
	for rows.Next() {
		var c claimed
		var ageMicros int64
		if err := rows.Scan(&c.id, &c.workflowID, &c.payload, &c.attempts, &ageMicros); err != nil {
			rows.Close()
			return 0, fmt.Errorf("claim outbox rows: %w", err)
		}
		c.age = time.Duration(ageMicros) * time.Microsecond
		batch = append(batch, c)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("claim outbox rows: %w", err)
	}
	if len(batch) == 0 {
		return 0, nil
	}
	slices.SortFunc(batch, func(a, b claimed) int { return cmp.Compare(a.id, b.id) })

	// Writes after the starts must happen even when ctx ends mid-batch:
	// they record what was done and give back what was not.
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	// Stop starting before the lease runs out, so that no other relay
	// claims a row this one is still starting.
	deadline := claimedAt.Add(r.lease - r.timeout)
	var sentIDs []int64
	var runIDs []string
	var startErr error
	for i, c := range batch {
		if ctx.Err() != nil || time.Now().After(deadline) {
			r.release(bg, token, batch[i:])
			break
		}
		st, err := r.startOne(ctx, c)
		if err != nil {
			if ctx.Err() != nil {
				r.release(bg, token, batch[i:])
				break
			}
			r.metrics.failed()
			r.reschedule(bg, token, c, err)
			r.release(bg, token, batch[i+1:])
			startErr = fmt.Errorf("start %s: %w", c.workflowID, err)
			break
		}
		r.metrics.started(st.Created, c.age+time.Since(claimedAt))
		sentIDs = append(sentIDs, c.id)
		runIDs = append(runIDs, st.RunID)
	}
	if len(sentIDs) > 0 {
		if _, err := r.db.Exec(bg, `
UPDATE keyed_outbox o
SET sent_at = now(), run_id = v.run_id, claimed_by = NULL, last_error = NULL
FROM unnest($1::bigint[], $2::text[]) AS v(id, run_id)
WHERE o.id = v.id AND o.sent_at IS NULL`, sentIDs, runIDs); err != nil {
			// The workflows are started; the rows will be claimed again
			// after the lease and their starts will collapse.
			return 0, errors.Join(startErr, fmt.Errorf("mark %d outbox rows sent: %w", len(sentIDs), err))
		}
		r.logger.DebugContext(ctx, "outbox rows sent", "rows", len(sentIDs))
	}
	return len(sentIDs), startErr
}

func (r *Relay) startOne(ctx context.Context, c claimed) (*Started, error) {
	var in orders.CheckoutInput
	if err := json.Unmarshal(c.payload, &in); err != nil {
		return nil, fmt.Errorf("%w: decode payload: %w", ErrInvalid, err)
	}
	if err := in.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	st, err := r.starter.Start(ctx, in)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return nil, errors.New("starter returned no result")
	}
	return st, nil
}

// reschedule pushes a failed row back by a jittered backoff that grows with
// its attempts.
func (r *Relay) reschedule(ctx context.Context, token string, c claimed, cause error) {
	wait := r.backoff(c.attempts)
	msg := cause.Error()
	if len(msg) > 512 {
		msg = msg[:512]
	}
	r.logger.WarnContext(ctx, "workflow start failed; will retry", "workflow_id", c.workflowID,
		"attempt", c.attempts, "retry_in", wait, "error", cause)
	if _, err := r.db.Exec(ctx, `
UPDATE keyed_outbox SET available_at = now() + $3 * interval '1 microsecond', last_error = $4, claimed_by = NULL
WHERE id = $1 AND claimed_by = $2 AND sent_at IS NULL`, c.id, token, wait.Microseconds(), msg); err != nil {
		r.logger.WarnContext(ctx, "reschedule outbox row; it returns when its lease runs out",
			"workflow_id", c.workflowID, "error", err)
	}
}

// release gives claimed rows back for immediate claiming, without counting
// the claim as an attempt.
func (r *Relay) release(ctx context.Context, token string, rows []claimed) {
	if len(rows) == 0 {
		return
	}
	ids := make([]int64, len(rows))
	for i, c := range rows {
		ids[i] = c.id
	}
	if _, err := r.db.Exec(ctx, `
UPDATE keyed_outbox SET available_at = now(), attempts = greatest(attempts - 1, 0), claimed_by = NULL
WHERE id = ANY($1) AND claimed_by = $2 AND sent_at IS NULL`, ids, token); err != nil {
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

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}
