package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// DefaultLease is how long a claim is held without an Extend before another
// owner may take it over.
const DefaultLease = 5 * time.Minute

// MaxResultBytes caps the JSON outcome stored by Complete. An outcome is an
// ID, a status and an amount; anything larger is almost certainly a payload.
const MaxResultBytes = 4096

// maxErrorMessage caps the failure message stored by Fail.
const maxErrorMessage = 512

// State is the state of an effect record.
type State string

// The states an effect record moves through.
const (
	StateClaimed         State = "claimed"
	StateSucceeded       State = "succeeded"
	StateFailedTransient State = "failed_transient"
	StateFailedTerminal  State = "failed_terminal"
)

// Mode says how a claim was acquired.
type Mode string

// The ways a claim is acquired.
const (
	// ModeNew: no record existed; this claim inserted it.
	ModeNew Mode = "new"
	// ModeRetry: the last attempt failed transiently; this claim took the key again.
	ModeRetry Mode = "retry"
	// ModeReentry: the same owner held the claim (an earlier attempt of the same step).
	ModeReentry Mode = "reentry"
	// ModeTakeover: another owner held the claim and its lease had expired.
	ModeTakeover Mode = "takeover"
)

// DB is what the Client needs from Postgres. *pgxpool.Pool, *pgx.Conn and
// pgx.Tx all satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ClientOpts configures a Client. A nil *ClientOpts means all defaults.
type ClientOpts struct {
	// Lease is the default claim lease. Zero means DefaultLease.
	Lease time.Duration
	// Logger receives one record per claim outcome. Nil means slog.Default().
	Logger *slog.Logger
	// Metrics receives counters and the claim-latency histogram. Nil means
	// no metrics.
	Metrics *Metrics
}

// Client claims, completes and fails effect records in Postgres. It is safe
// for concurrent use.
type Client struct {
	db      DB
	lease   time.Duration
	logger  *slog.Logger
	metrics *Metrics
	leaves  leafCache
}

// NewClient returns a Client over db, which must have keyed's migrations
// applied. It returns an error if db is nil or opts are invalid.
func NewClient(db DB, opts *ClientOpts) (*Client, error) {
	if db == nil {
		return nil, errors.New("effects: NewClient: db is nil")
	}
	if opts == nil {
		opts = &ClientOpts{}
	}
	c := &Client{db: db, lease: opts.Lease, logger: opts.Logger, metrics: opts.Metrics}
	switch {
	case c.lease == 0:
		c.lease = DefaultLease
	case c.lease < time.Second:
		return nil, fmt.Errorf("effects: NewClient: lease %s is shorter than one second", c.lease)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return c, nil
}

// ClaimParams says which effect to claim and who claims it.
type ClaimParams struct {
	// Key names the effect. Required.
	Key Key
	// Kind groups effects for metrics, such as "charge" or "receipt".
	// Empty means the key's last part.
	Kind string
	// Owner identifies the logical step claiming the key. A later attempt
	// with the same Owner re-enters its own claim at once; any other owner
	// waits for the lease to run out. For a Temporal activity use the
	// workflow ID and step name, never the attempt number. Required.
	Owner string
	// Fingerprint identifies the effect's deterministic inputs, such as a
	// hash of amount and currency. Every claim of a key must carry the
	// fingerprint of its first claim (empty included); another one fails
	// with ErrKeyReused instead of replaying a different request's result.
	Fingerprint string
	// Lease overrides the client's default lease for this claim.
	Lease time.Duration
	// MaxResultBytes overrides MaxResultBytes, the cap on the JSON outcome
	// Complete stores for this claim, for an effect whose outcome is a
	// bounded document, such as a stored HTTP response. Zero means
	// MaxResultBytes.
	MaxResultBytes int
	// NotBefore, if set, is a time before which no claim of Key can have
	// begun: the creation time, as the database stored it, of the business
	// record the key derives from, such as an order's created_at. The
	// claim then looks for the key only in the leaves holding records
	// created from an hour before it on, instead of in every leaf of the
	// kind's class, which keeps a fresh key's claim as cheap with many
	// leaves as with few. Never pass a time taken when the claim is made
	// (time.Now, a workflow's start): a key claimed before it would be
	// claimed again. A NotBefore more than an hour later than the claim
	// fails with ErrLateNotBefore; one less than an hour ahead (clocks that
	// differ) counts as the claim's time. Zero means unknown: the claim
	// looks in every leaf.
	NotBefore time.Time
	// Repeat says the effect is being run again (a retried activity's
	// later attempt), so its key most likely holds a record already: a
	// told claim then goes straight to the claim function, which reads
	// that record in the same statement, instead of first trying its
	// insert from Go, which would only meet it. A Repeat claim of a fresh
	// key still claims it, through the function.
	Repeat bool
	// AsyncCommit lets Claim commit a new claim without waiting for the
	// WAL flush (synchronous_commit off for that one statement), which
	// saves an fsync per new key. A crash may then lose the claim, never
	// its completion, whose synchronous commit flushes the claim with it.
	// Set it only where a lost claim is harmless: the effect is a write to
	// the same database, stored with CompleteTx in a transaction that
	// commits synchronously (a claim lost had done nothing), or the
	// provider takes the key as its idempotency key, so that the attempt
	// which claims it again is answered with the first one's result. ClaimTx
	// refuses it, and so does Do with AtMostOnce.
	AsyncCommit bool
}

// kind is p.Kind, or the last part of p.Key when it is empty.
func (p ClaimParams) kind() string {
	if p.Kind != "" {
		return p.Kind
	}
	parts := p.Key.Parts()
	return parts[len(parts)-1]
}

// Claim is the result of claiming a key. Either the caller now owns the
// effect (Done is false) or the effect already happened (Done is true) and
// Result holds its stored outcome.
type Claim struct {
	Key        Key
	Kind       string
	Owner      string
	Mode       Mode
	Generation int64
	Attempt    int
	LeaseUntil time.Time
	Done       bool
	Result     json.RawMessage
	// Resolved is set on a ModeRetry claim of a record an operator resolved
	// with ResolveRetry: someone who checked says the effect did not happen.
	Resolved bool

	maxResult int       // ClaimParams.MaxResultBytes, or zero
	createdAt time.Time // the record's created_at
	leaf      string    // the table holding the record: its leaf, or keyed_effects unpartitioned
}

// Decode unmarshals the stored outcome of a Done claim into v.
func (c *Claim) Decode(v any) error {
	if len(c.Result) == 0 {
		return nil
	}
	if err := json.Unmarshal(c.Result, v); err != nil {
		return fmt.Errorf("decode stored result of %s: %w", c.Key, err)
	}
	return nil
}

// Claim claims p.Key in one round trip (two for a told key that has a
// record: docs/design.md, "Claiming from Go") and branches on an existing record:
// succeeded gives a Done claim with the stored result; terminal failure a
// *TerminalError; a live claim of another owner an *InProgressError; an
// expired claim, the same owner or a transient failure is taken over (one
// racer wins). A different fingerprint gives a *KeyReusedError; invalid
// params an error wrapping ErrInvalidKey or naming the missing field, and a
// NotBefore more than an hour ahead one wrapping ErrLateNotBefore.
func (c *Client) Claim(ctx context.Context, p ClaimParams) (*Claim, error) {
	return c.claim(ctx, c.db, p)
}

// ClaimTx is Claim inside the caller's transaction: the claim commits or rolls
// back with it, and racers for the same key wait on the transaction. The
// transaction must run at READ COMMITTED, Postgres's default. It refuses
// p.AsyncCommit, which would apply to the caller's whole transaction.
func (c *Client) ClaimTx(ctx context.Context, tx pgx.Tx, p ClaimParams) (*Claim, error) {
	if p.AsyncCommit {
		return nil, fmt.Errorf("claim %s: AsyncCommit is for Claim only, not ClaimTx", p.Key)
	}
	return c.claim(ctx, tx, p)
}

// claimSQL claims through keyed_effects_claim (effects' migrations 2 and
// 5): it inserts the claim or, when the key has a record, reads it, in one
// round trip; the first column says which. A racer's record committed while
// the insert waited reads as no row, and the caller tries again. $7 turns
// synchronous_commit off for the statement's transaction (AsyncCommit); $8
// is NotBefore, -infinity when unknown.
const claimSQL = `SELECT * FROM keyed_effects_claim($1, $2, $3, $4, $5, $6, $7, $8)`

// claimSQLWithoutBound is claimSQL on a schema before effects migration 5,
// whose claim function takes no NotBefore: a release whose workers migrate
// nothing at start (MIGRATE_ON_START=false) keeps claiming until the
// deployment's migration job has run.
const claimSQLWithoutBound = `SELECT * FROM keyed_effects_claim($1, $2, $3, $4, $5, $6, $7)`

// notBefore is p.NotBefore as claimSQL takes it.
func notBefore(p ClaimParams) pgtype.Timestamptz {
	if p.NotBefore.IsZero() {
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	return pgtype.Timestamptz{Time: p.NotBefore, Valid: true}
}

// queryClaim runs claimSQL and returns the record it read (for a new
// claim, only Generation, Attempts, LeaseUntil and CreatedAt), whether the
// claim inserted it, and whether its lease is live.
// Without bound, it claims through the seven-argument function of a schema
// before effects migration 5, which looks in every leaf.
func queryClaim(ctx context.Context, db DB, p ClaimParams, lease time.Duration, bound bool) (rec *Record, leaf string, inserted, live bool, err error) {
	rec = &Record{}
	sql, args := claimSQL, []any{p.Key.String(), p.Key.Tenant(), p.Kind, p.Owner, p.Fingerprint,
		lease.Microseconds(), p.AsyncCommit, notBefore(p)}
	if !bound {
		sql, args = claimSQLWithoutBound, args[:7]
	}
	err = db.QueryRow(ctx, sql, args...).Scan(&inserted, &rec.Generation, &rec.Attempts, &rec.LeaseUntil,
		&rec.State, &rec.Owner, &rec.Fingerprint, &rec.Result, &rec.ErrorCode, &rec.ErrorMessage, &rec.CreatedAt, &live, &leaf)
	return rec, leaf, inserted, live, err
}

// table is the table a statement about the claim's record names: its leaf,
// so that the statement plans and locks one table, not every leaf.
func (cl *Claim) table() string {
	if cl.leaf == "" {
		return "keyed_effects"
	}
	return cl.leaf
}

// claimTakeSQL takes over an existing record only if it is still the
// generation that was read and may still be taken: a concurrent taker bumps
// the generation, and a concurrent Extend makes the lease live again.
const claimTakeSQL = `
UPDATE %s
SET state = 'claimed', owner = $3, generation = generation + 1, attempts = attempts + 1,
    lease_until = now() + $4 * interval '1 microsecond',
    error_code = NULL, error_message = NULL, finished_at = NULL, updated_at = now()
WHERE key = $1 AND generation = $2 AND created_at = $5
  AND (state = 'failed_transient' OR (state = 'claimed' AND (owner = $3 OR lease_until <= now())))
RETURNING generation, attempts, lease_until`

func (c *Client) claim(ctx context.Context, db DB, p ClaimParams) (*Claim, error) {
	start := time.Now()
	if p.Key.IsZero() {
		return nil, fmt.Errorf("claim: %w: key is empty", ErrInvalidKey)
	}
	if p.Owner == "" {
		return nil, fmt.Errorf("claim %s: owner is empty", p.Key)
	}
	if p.MaxResultBytes < 0 {
		return nil, fmt.Errorf("claim %s: MaxResultBytes %d is negative", p.Key, p.MaxResultBytes)
	}
	p.Kind = p.kind()
	lease := p.Lease
	if lease <= 0 {
		lease = c.lease
	}
	fresh, err := c.claimFromGo(ctx, db, p, lease)
	if err != nil {
		return nil, err
	}
	if fresh != nil {
		return c.acquired(ctx, fresh, start), nil
	}
	cl := &Claim{Key: p.Key, Kind: p.Kind, Owner: p.Owner, maxResult: p.MaxResultBytes}

	// A few rounds cover a record that changes between the failed insert and
	// the read (a racer's commit or takeover, or a prune of a finished
	// record).
	for round := 0; round < 5; round++ {
		rec, leaf, inserted, live, err := queryClaim(ctx, db, p, lease, true)
		if unmigrated(err) {
			// Inside a caller's transaction the failed statement has
			// aborted it: a transient error, until the schema is migrated.
			if db != c.db {
				return nil, Transient(fmt.Errorf("claim %s: the effects schema predates effects migration 5; run the migrations: %w", p.Key, err))
			}
			rec, leaf, inserted, live, err = queryClaim(ctx, db, p, lease, false)
		}
		if errors.Is(err, pgx.ErrNoRows) || layoutChanged(err) {
			continue
		}
		if noLeaf(err) {
			// The retention window makes leaves ahead; one that has not
			// run is made up for here. Inside a caller's transaction the
			// failed statement has aborted it: a transient error.
			if _, ensureErr := ensureLeaves(ctx, c.db, 0, 48*time.Hour); ensureErr != nil || db != c.db {
				return nil, Transient(fmt.Errorf("claim %s: %w", p.Key, err))
			}
			continue
		}
		if lateNotBefore(err) {
			return nil, fmt.Errorf("claim %s: %w: %s", p.Key, ErrLateNotBefore, p.NotBefore.UTC().Format(time.RFC3339Nano))
		}
		if err != nil {
			return nil, fmt.Errorf("claim %s: %w", p.Key, err)
		}
		if inserted {
			cl.Mode, cl.Generation, cl.Attempt, cl.LeaseUntil = ModeNew, rec.Generation, rec.Attempts, *rec.LeaseUntil
			cl.createdAt, cl.leaf = rec.CreatedAt, leaf
			return c.acquired(ctx, cl, start), nil
		}
		if rec.Fingerprint != p.Fingerprint {
			c.metrics.mismatch(p.Kind)
			c.log(ctx, slog.LevelWarn, "effect key reused with different inputs", p, "stored_owner", rec.Owner)
			return nil, &KeyReusedError{Key: p.Key.String()}
		}
		switch rec.State {
		case StateSucceeded:
			cl.Done, cl.Result, cl.Generation, cl.Attempt = true, rec.Result, rec.Generation, rec.Attempts
			c.metrics.suppressed(p.Kind, time.Since(start), time.Since(rec.CreatedAt))
			c.log(ctx, slog.LevelInfo, "effect already done; duplicate suppressed", p)
			return cl, nil
		case StateFailedTerminal:
			c.metrics.suppressed(p.Kind, time.Since(start), time.Since(rec.CreatedAt))
			c.log(ctx, slog.LevelInfo, "effect failed terminally before; returning stored failure", p, "code", rec.ErrorCode)
			return nil, &TerminalError{Key: p.Key.String(), Code: rec.ErrorCode, Message: rec.ErrorMessage}
		case StateClaimed:
			switch {
			case rec.Owner == p.Owner:
				cl.Mode = ModeReentry
			case !live:
				cl.Mode = ModeTakeover
			default:
				c.metrics.inProgress(p.Kind)
				c.log(ctx, slog.LevelInfo, "effect in progress elsewhere", p, "holder", rec.Owner)
				return nil, &InProgressError{Key: p.Key.String(), Owner: rec.Owner, LeaseUntil: *rec.LeaseUntil}
			}
		case StateFailedTransient:
			cl.Mode, cl.Resolved = ModeRetry, rec.ErrorCode == CodeResolvedRetry
		}
		cl.createdAt, cl.leaf = rec.CreatedAt, leaf
		err = db.QueryRow(ctx, fmt.Sprintf(claimTakeSQL, cl.table()), p.Key.String(), rec.Generation, p.Owner, lease.Microseconds(), rec.CreatedAt).
			Scan(&cl.Generation, &cl.Attempt, &cl.LeaseUntil)
		if err == nil {
			return c.acquired(ctx, cl, start), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("claim %s: %w", p.Key, err)
		}
		// Another racer changed the record first; read it again.
	}
	c.metrics.inProgress(p.Kind)
	return nil, fmt.Errorf("claim %s: %w: record kept changing under contention", p.Key, ErrInProgress)
}

// layoutChanged reports the error of a claim that began on the
// unpartitioned table and ran into Partition's swap (its ON CONFLICT finds
// no unique index on the partitioned parent); it did nothing, and the next
// round claims on the new layout.
func layoutChanged(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P10"
}

// unmigrated reports a claim whose function has no NotBefore argument: a
// schema before effects migration 5.
func unmigrated(err error) bool {
	return missingFunction(err, "keyed_effects_claim(")
}

// missingFunction reports an error for a call of a function, named with
// its "(", that the schema does not have (or not with these arguments).
func missingFunction(err error, name string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42883" && strings.Contains(pgErr.Message, name)
}

// lateNotBefore reports a claim refused for a NotBefore more than an hour
// later than itself.
func lateNotBefore(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22023" && strings.HasPrefix(pgErr.Message, "keyed effect claim: not_before")
}

// noLeaf reports a claim that found no leaf for now: maintenance is behind.
func noLeaf(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.HasPrefix(pgErr.Message, "no partition of relation")
}

// acquired counts and logs a claim: a new one at debug (the step's own
// line says what came of it), a retry, re-entry or takeover at info.
func (c *Client) acquired(ctx context.Context, cl *Claim, start time.Time) *Claim {
	c.metrics.acquired(cl.Kind, cl.Mode, time.Since(start))
	level := slog.LevelInfo
	if cl.Mode == ModeNew {
		level = slog.LevelDebug
	}
	c.logger.LogAttrs(ctx, level, "effect claimed",
		slog.String("effect_key", cl.Key.String()), slog.String("kind", cl.Kind), slog.String("owner", cl.Owner),
		slog.String("mode", string(cl.Mode)), slog.Int("attempt", cl.Attempt))
	return cl
}

func (c *Client) log(ctx context.Context, level slog.Level, msg string, p ClaimParams, args ...any) {
	c.logger.Log(ctx, level, msg, append([]any{"effect_key", p.Key.String(), "kind", p.Kind, "owner", p.Owner}, args...)...)
}

// Complete stores result, the claimed effect's outcome (IDs, statuses,
// amounts; never secrets), as JSON. It returns ErrLeaseLost if the claim was
// taken over or released, ErrResultTooLarge over MaxResultBytes, and an error
// if the claim was not acquired.
func (c *Client) Complete(ctx context.Context, claim *Claim, result any) error {
	return c.complete(ctx, c.db, claim, result)
}

// CompleteTx is Complete inside the caller's transaction, so that a database
// effect and its record commit or roll back together.
func (c *Client) CompleteTx(ctx context.Context, tx pgx.Tx, claim *Claim, result any) error {
	return c.complete(ctx, tx, claim, result)
}

func (c *Client) complete(ctx context.Context, db DB, claim *Claim, result any) error {
	if err := checkOwned(claim); err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	body, err := json.Marshal(result)
	if err != nil {
		return fmt.Errorf("complete %s: encode result: %w", claim.Key, err)
	}
	limit := MaxResultBytes
	if claim.maxResult > 0 {
		limit = claim.maxResult
	}
	if len(body) > limit {
		return fmt.Errorf("complete %s: %w: %d bytes, limit %d", claim.Key, ErrResultTooLarge, len(body), limit)
	}
	tag, err := db.Exec(ctx, `
UPDATE `+claim.table()+`
SET state = 'succeeded', result = $3, lease_until = NULL, finished_at = now(), updated_at = now()
WHERE key = $1 AND generation = $2 AND owner = $4 AND state = 'claimed' AND created_at = $5`,
		claim.Key.String(), claim.Generation, body, claim.Owner, claim.createdAt)
	if err != nil {
		return fmt.Errorf("complete %s: %w", claim.Key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("complete %s: %w", claim.Key, ErrLeaseLost)
	}
	claim.Done, claim.Result = true, body
	c.logger.LogAttrs(ctx, slog.LevelDebug, "effect completed",
		slog.String("effect_key", claim.Key.String()), slog.String("kind", claim.Kind))
	return nil
}

// Fail records that the claimed effect failed: as transient (claimed again
// next time) if cause is marked Transient, else as terminal (later claims get
// a *TerminalError), with the code of the first Coded error in cause. It
// returns ErrLeaseLost if the claim was taken over or released.
func (c *Client) Fail(ctx context.Context, claim *Claim, cause error) error {
	return c.fail(ctx, c.db, claim, cause)
}

// FailTx is Fail inside the caller's transaction.
func (c *Client) FailTx(ctx context.Context, tx pgx.Tx, claim *Claim, cause error) error {
	return c.fail(ctx, tx, claim, cause)
}

func (c *Client) fail(ctx context.Context, db DB, claim *Claim, cause error) error {
	if err := checkOwned(claim); err != nil {
		return fmt.Errorf("fail: %w", err)
	}
	if cause == nil {
		return fmt.Errorf("fail %s: cause is nil", claim.Key)
	}
	state := StateFailedTerminal
	if IsTransient(cause) {
		state = StateFailedTransient
	}
	msg := cause.Error()
	if len(msg) > maxErrorMessage {
		msg = msg[:maxErrorMessage]
	}
	code := errorCode(cause)
	tag, err := db.Exec(ctx, `
UPDATE `+claim.table()+`
SET state = $3, error_code = $4, error_message = $5, lease_until = NULL, finished_at = now(), updated_at = now()
WHERE key = $1 AND generation = $2 AND owner = $6 AND state = 'claimed' AND created_at = $7`,
		claim.Key.String(), claim.Generation, state, code, msg, claim.Owner, claim.createdAt)
	if err != nil {
		return fmt.Errorf("fail %s: %w", claim.Key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("fail %s: %w", claim.Key, ErrLeaseLost)
	}
	c.metrics.failed(claim.Kind, state)
	c.logger.LogAttrs(ctx, slog.LevelWarn, "effect failed",
		slog.String("effect_key", claim.Key.String()), slog.String("kind", claim.Kind),
		slog.String("state", string(state)), slog.String("code", code))
	return nil
}

// Extend renews the claim's lease to lease from now; zero means the client's
// default. Call it from a heartbeat. It returns ErrLeaseLost when the claim
// is no longer the caller's, which is the signal to stop working.
func (c *Client) Extend(ctx context.Context, claim *Claim, lease time.Duration) error {
	if err := checkOwned(claim); err != nil {
		return fmt.Errorf("extend: %w", err)
	}
	if lease <= 0 {
		lease = c.lease
	}
	err := c.db.QueryRow(ctx, `
UPDATE `+claim.table()+` SET lease_until = now() + $3 * interval '1 microsecond', updated_at = now()
WHERE key = $1 AND generation = $2 AND owner = $4 AND state = 'claimed' AND created_at = $5
RETURNING lease_until`, claim.Key.String(), claim.Generation, lease.Microseconds(), claim.Owner, claim.createdAt).Scan(&claim.LeaseUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("extend %s: %w", claim.Key, ErrLeaseLost)
	}
	if err != nil {
		return fmt.Errorf("extend %s: %w", claim.Key, err)
	}
	return nil
}

func checkOwned(claim *Claim) error {
	switch {
	case claim == nil:
		return errors.New("claim is nil")
	case claim.Done:
		return fmt.Errorf("%s: claim is already done", claim.Key)
	case claim.Mode == "":
		return fmt.Errorf("%s: claim was not acquired", claim.Key)
	}
	return nil
}
