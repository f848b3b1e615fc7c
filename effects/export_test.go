package effects

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricsCounterForTest exposes a counter to the external tests.
func MetricsCounterForTest(m *Metrics, name string) *prometheus.CounterVec {
	switch name {
	case "suppressed":
		return m.suppressedTotal
	case "takeovers":
		return m.takeoversTotal
	case "mismatch":
		return m.mismatchTotal
	case "in_progress":
		return m.inProgressTotal
	}
	panic("unknown metric " + name)
}

// MetricsCollectorForTest exposes a histogram to the external tests.
func MetricsCollectorForTest(m *Metrics, name string) prometheus.Collector {
	switch name {
	case "duplicate_age":
		return m.duplicateAge
	}
	panic("unknown metric " + name)
}

// ListSQL is List's statement, for the tests of its plan.
const ListSQL = listSQL

// RecordColumns is the column list Get reads, for benchmarks of its statements.
const RecordColumns = recordColumns

// ClaimFromGoForTest runs Claim's statement from Go alone: a new claim, or
// nil when the claim must go through the claim function.
func ClaimFromGoForTest(ctx context.Context, c *Client, db DB, p ClaimParams) (*Claim, error) {
	p.Kind = p.kind()
	return c.claimFromGo(ctx, db, p, DefaultLease)
}

// ClaimLeafSQLForTest returns the statement a told claim of kind sends
// from Go into leaf of class, for an AsyncCommit claim if async.
func ClaimLeafSQLForTest(kind, class, leaf string, async bool) string {
	l := mustClaimLeaf(kind, class, leaf, time.Time{}, time.Time{})
	if async {
		return l.asyncSQL
	}
	return l.sql
}

// SetLeafPictureForTest gives c a picture of one leaf for kind, as if read
// just now, however the schema stands.
func SetLeafPictureForTest(c *Client, kind, class, leaf string, lo, hi time.Time) {
	l := mustClaimLeaf(kind, class, leaf, lo, hi)
	c.leaves.pic.Store(&leafPicture{at: time.Now(), leaves: map[string][]claimLeaf{kind: {l}}})
}

// mustClaimLeaf is newClaimLeaf for a leaf a test names, which must be one
// claimLeafSQL can spell.
func mustClaimLeaf(kind, class, leaf string, lo, hi time.Time) claimLeaf {
	l, ok := newClaimLeaf(kind, class, leaf, lo, hi)
	if !ok {
		panic("a leaf claimLeafSQL cannot name: " + leaf)
	}
	return l
}

// LeafPictureForTest reports the leaves c's picture names for kind, and
// whether c has a picture.
func LeafPictureForTest(c *Client, kind string) ([]string, bool) {
	pic := c.leaves.pic.Load()
	if pic == nil || pic.leaves == nil {
		return nil, false
	}
	var names []string
	for _, l := range pic.leaves[kind] {
		names = append(names, l.name)
	}
	return names, true
}
