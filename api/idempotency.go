package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
)

// Retention is how long a stored response stays replayable: 24 hours, as
// at Stripe. Prune never deletes a record younger than this, so a client may
// retry with the same Idempotency-Key for at least a day and get the first
// response back. After that the key may be used afresh.
const Retention = config.IdempotencyRetention

// DefaultRequestLease is how long a request holds its Idempotency-Key before
// another request may take it over. A holder that dies (its transaction
// rolled back, so it did nothing) blocks retries with 409 for at most this
// long.
const DefaultRequestLease = 30 * time.Second

// MaxIdempotencyKeyLen is the longest Idempotency-Key accepted, in bytes.
const MaxIdempotencyKeyLen = 255

// KindAPIRequest is the effect kind of an HTTP request's Idempotency-Key
// record in keyed_effects. Its keys are "<tenant>:idempotency:<key>", or
// "<tenant>:idempotency-sha256:<hex>" for a key that holds ":" or would
// make the effect key too long, so they never fall under an order's prefix.
const KindAPIRequest = "api_request"

// maxStoredResponse caps a stored response (status and body, as JSON).
const maxStoredResponse = 64 << 10

// errKeyReused, errInProgress and errLeaseLost are the idempotency store's
// refusals; the handler turns them into 422, 409 and 409.
var (
	errKeyReused  = errors.New("idempotency key reused with a different request")
	errInProgress = errors.New("idempotency key held by a running request")
	errLeaseLost  = errors.New("idempotency key taken over by another request")
)

// stored is a finished request's response: the status and body sent, and
// the outcome its record keeps (nil for a record of the earlier form,
// whose body is replayed as it was stored).
type stored struct {
	status  int
	body    []byte
	outcome *outcome
}

// storedJSON is a stored response as kept in the effect record,
// {"status":201,"body":{"v":1,"order":{…}}}, Body being the outcome a replay
// renders again. Older records hold the whole body as a JSON string, replayed
// as it is until they age out.
type storedJSON struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

// idemStore keeps one effect record (kind KindAPIRequest) per tenant and
// Idempotency-Key. A request claims its key with effects.Client.Claim; the
// winner runs, and stores its response in its own transaction with
// finishTx, so the business writes and the stored response commit or roll
// back together. A request that fails releases its claim.
type idemStore struct {
	claims *effects.Client
	lease  time.Duration
}

// newIdemStore returns a store over db. Its effects client has no metrics
// (keyed_api_idempotency_total counts the outcomes; a client's 422 is not a
// fingerprint mismatch to page on) and logs only warnings: the access log
// has a record per request already.
func newIdemStore(db effects.DB, logger *slog.Logger, lease time.Duration) (*idemStore, error) {
	claims, err := effects.NewClient(db, &effects.ClientOpts{Logger: slog.New(warnOnly{logger.Handler()})})
	if err != nil {
		return nil, fmt.Errorf("idempotency store: %w", err)
	}
	return &idemStore{claims: claims, lease: lease}, nil
}

// requestKey is the effect key of tenant's Idempotency-Key idem: the key
// itself when it is a valid key part that fits, else its SHA-256 under
// another part, so two client keys never share an effect key.
func requestKey(tenant, idem string) (effects.Key, error) {
	if k, err := effects.NewKey(tenant, "idempotency", idem); err == nil {
		return k, nil
	}
	sum := sha256.Sum256([]byte(idem))
	k, err := effects.NewKey(tenant, "idempotency-sha256", hex.EncodeToString(sum[:]))
	if err != nil {
		return effects.Key{}, fmt.Errorf("idempotency key of tenant %q: %w", tenant, err)
	}
	return k, nil
}

// claim claims key for owner, or returns the stored response of a finished
// request with the same hash (a Done claim and the response). It returns
// errKeyReused when the key was first used with another hash, and
// errInProgress when another request holds it under a live lease.
func (s *idemStore) claim(ctx context.Context, key effects.Key, hash, owner string) (*effects.Claim, *stored, error) {
	cl, err := s.claims.Claim(ctx, effects.ClaimParams{Key: key, Kind: KindAPIRequest, Owner: owner, Fingerprint: hash,
		Lease: s.lease, MaxResultBytes: maxStoredResponse, AsyncCommit: true})
	switch {
	case errors.Is(err, effects.ErrKeyReused):
		return nil, nil, errKeyReused
	case errors.Is(err, effects.ErrInProgress):
		return nil, nil, errInProgress
	case err != nil:
		return nil, nil, fmt.Errorf("claim idempotency key: %w", err)
	case !cl.Done:
		return cl, nil, nil
	}
	prev, err := decodeStored(cl)
	if err != nil {
		return nil, nil, err
	}
	return cl, prev, nil
}

// decodeStored reads a finished claim's stored response: its outcome, or
// the body of a record of the earlier form.
func decodeStored(cl *effects.Claim) (*stored, error) {
	var sj storedJSON
	if err := cl.Decode(&sj); err != nil {
		return nil, fmt.Errorf("read stored response: %w", err)
	}
	prev := &stored{status: sj.Status}
	if len(sj.Body) > 0 && sj.Body[0] == '"' {
		var body string
		if err := json.Unmarshal(sj.Body, &body); err != nil {
			return nil, fmt.Errorf("read stored response body: %w", err)
		}
		prev.body = []byte(body)
		return prev, nil
	}
	if err := json.Unmarshal(sj.Body, &prev.outcome); err != nil {
		return nil, fmt.Errorf("read stored response outcome: %w", err)
	}
	if prev.outcome == nil || prev.outcome.V != outcomeVersion {
		return nil, fmt.Errorf("read stored response: no outcome of version %d", outcomeVersion)
	}
	return prev, nil
}

// finishTx stores the response's status and outcome in tx, the
// transaction that made the request's writes. It returns errLeaseLost if
// another request took the key over, in which case tx must roll back.
func (s *idemStore) finishTx(ctx context.Context, tx pgx.Tx, cl *effects.Claim, resp stored) error {
	if resp.outcome == nil {
		return errors.New("store response: no outcome")
	}
	body, err := json.Marshal(resp.outcome)
	if err != nil {
		return fmt.Errorf("store response: %w", err)
	}
	err = s.claims.CompleteTx(ctx, tx, cl, storedJSON{Status: resp.status, Body: body})
	if errors.Is(err, effects.ErrLeaseLost) {
		return errLeaseLost
	}
	if err != nil {
		return fmt.Errorf("store response: %w", err)
	}
	return nil
}

// release deletes owner's claim, after a failure that wrote nothing, so that
// a retry runs at once instead of waiting out the lease.
func (s *idemStore) release(ctx context.Context, key effects.Key, owner string) error {
	if _, err := s.claims.Release(ctx, key, owner); err != nil {
		return fmt.Errorf("release idempotency key: %w", err)
	}
	return nil
}

// PruneOpts configures Prune. A nil *PruneOpts means all defaults.
type PruneOpts struct {
	// Retention is how long finished requests stay replayable. Zero means
	// Retention; shorter values are refused.
	Retention time.Duration
	// BatchSize bounds each DELETE. Zero means 1000.
	BatchSize int
}

// Prune deletes idempotency records (kind KindAPIRequest) older than the
// retention, finished ones by finish time and abandoned claims by lease, and
// returns how many. It returns an error for a retention under Retention or
// from the database.
func Prune(ctx context.Context, db effects.DB, opts *PruneOpts) (int64, error) {
	claims, err := effects.NewClient(db, &effects.ClientOpts{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, fmt.Errorf("prune API requests: %w", err)
	}
	return prune(ctx, claims, opts)
}

func prune(ctx context.Context, claims *effects.Client, opts *PruneOpts) (int64, error) {
	if opts == nil {
		opts = &PruneOpts{}
	}
	retention := opts.Retention
	if retention == 0 {
		retention = Retention
	}
	if retention < Retention {
		return 0, fmt.Errorf("prune API requests: retention %s is under the documented %s", retention, Retention)
	}
	n, err := claims.PruneKind(ctx, KindAPIRequest, &effects.PruneKindOpts{Retention: retention, BatchSize: opts.BatchSize, ExpiredClaims: true})
	if err != nil {
		return n, fmt.Errorf("prune API requests: %w", err)
	}
	return n, nil
}

// warnOnly passes on records at slog.LevelWarn and above.
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnOnly) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnOnly{h.Handler.WithAttrs(attrs)}
}

func (h warnOnly) WithGroup(name string) slog.Handler { return warnOnly{h.Handler.WithGroup(name)} }
