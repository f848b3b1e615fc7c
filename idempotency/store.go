package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
)

// Errors of a request's key.
var (
	// ErrLeaseLost means another request took the key over while this one
	// ran (it outlived the lease): its transaction must roll back.
	ErrLeaseLost = errors.New("idempotency key taken over by another request")
	// ErrNotRendered means a Response's Kept does not render (RouteOpts.Replay)
	// to its Body byte for byte, so a replay would differ: it is not stored.
	ErrNotRendered = errors.New("the response does not render from what it keeps")
	// ErrCompleted means the request's response was stored already.
	ErrCompleted = errors.New("idempotency key's response already stored")
)

// errKeyReused and errInProgress are the claim's refusals, answered 422 and
// 409.
var (
	errKeyReused  = errors.New("idempotency key reused with a different request")
	errInProgress = errors.New("idempotency key held by a running request")
)

// stored is a finished request's response as its record keeps it:
// {"status":201,"header":{…},"body":…}. Body is a JSON string holding the
// body itself, or what a route keeps (Response.Kept), which its Replay
// renders again.
type stored struct {
	Status int               `json:"status"`
	Header map[string]string `json:"header,omitempty"`
	Body   json.RawMessage   `json:"body"`
}

// StoredKey returns the effect key of tenant's key idem: the key itself
// when it is a valid key part that fits, else its SHA-256 under another
// part, so that two client keys never share an effect key.
func StoredKey(tenant, idem string) (effects.Key, error) {
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

// store keeps one effect record (kind Kind) per tenant and key.
type store struct {
	claims *effects.Client
	lease  time.Duration
}

// claim claims key for owner, or returns the stored response of a finished
// request with the same fingerprint. It returns errKeyReused when the key
// was first used with another fingerprint, and errInProgress when another
// request holds it under a live lease.
func (s *store) claim(ctx context.Context, key effects.Key, fingerprint, owner string) (*effects.Claim, *stored, error) {
	cl, err := s.claims.Claim(ctx, effects.ClaimParams{Key: key, Kind: Kind, Owner: owner, Fingerprint: fingerprint,
		Lease: s.lease, MaxResultBytes: MaxStoredBytes, AsyncCommit: true})
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
	var prev stored
	if err := cl.Decode(&prev); err != nil {
		return nil, nil, fmt.Errorf("read stored response: %w", err)
	}
	return cl, &prev, nil
}

// encode returns what the record keeps of resp.
func encode(resp Response) (stored, error) {
	st := stored{Status: resp.Status, Body: resp.Kept}
	if len(resp.Header) > 0 {
		st.Header = make(map[string]string, len(resp.Header))
		for k := range resp.Header {
			st.Header[http.CanonicalHeaderKey(k)] = resp.Header.Get(k)
		}
	}
	if st.Body == nil {
		if !utf8.Valid(resp.Body) {
			return st, errors.New("store response: the body is not UTF-8; keep it with Response.Kept and RouteOpts.Replay")
		}
		body, err := json.Marshal(string(resp.Body))
		if err != nil {
			return st, fmt.Errorf("store response: %w", err)
		}
		st.Body = body
	}
	return st, nil
}

// completeTx stores resp in tx. It returns ErrLeaseLost if another request
// took the key over, in which case tx must roll back.
func (s *store) completeTx(ctx context.Context, tx pgx.Tx, cl *effects.Claim, st stored) error {
	err := s.claims.CompleteTx(ctx, tx, cl, st)
	if errors.Is(err, effects.ErrLeaseLost) {
		return ErrLeaseLost
	}
	if err != nil {
		return fmt.Errorf("store response: %w", err)
	}
	return nil
}

// release deletes owner's claim after a request that stored nothing: in
// the claim's leaf when the claim came back (cl), else wherever key is (a
// claim whose reply was lost).
func (s *store) release(ctx context.Context, key effects.Key, owner string, cl *effects.Claim) error {
	var err error
	if cl != nil {
		_, err = s.claims.ReleaseClaim(ctx, cl)
	} else {
		_, err = s.claims.Release(ctx, key, owner, &effects.ReleaseOpts{Kind: Kind})
	}
	if err != nil {
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

// Prune deletes records (kind Kind) older than the retention, finished ones
// by finish time and abandoned claims by lease, and returns how many. It
// returns an error for a retention under Retention or from the database.
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
	n, err := claims.PruneKind(ctx, Kind, &effects.PruneKindOpts{Retention: retention, BatchSize: opts.BatchSize, ExpiredClaims: true})
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
