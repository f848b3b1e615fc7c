package effectstest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

// TimePass is one timed pass of a retention benchmark: it vacuums and
// analyses table and checkpoints, so that the pass starts from a table
// written out, then runs work and returns how long it took and the WAL
// bytes written meanwhile. It fails the benchmark when work fails or
// deletes other than want rows.
func TimePass(b testing.TB, db effects.DB, table string, want int64, work func(context.Context) (int64, error)) (time.Duration, int64) {
	b.Helper()
	ctx := context.Background()
	for _, sql := range []string{`VACUUM ANALYZE ` + table, `CHECKPOINT`} {
		_, err := db.Exec(ctx, sql)
		require.NoError(b, err)
	}
	lsn := func() (s string) {
		require.NoError(b, db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s))
		return s
	}
	before := lsn()
	start := time.Now()
	n, err := work(ctx)
	d := time.Since(start)
	require.NoError(b, err)
	require.Equal(b, want, n)
	var wal int64
	require.NoError(b, db.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, lsn(), before).Scan(&wal))
	return d, wal
}

// ComparePasses runs the passes base and next b.N times each, alternating
// which goes first, each pass handling rows of unit (such as "records").
// It reports each side's unit/s and WAL MiB per pass, base's under the
// prefix baseName, and next's speed-up over base.
func ComparePasses(b *testing.B, rows int, unit, baseName string, base, next func() (time.Duration, int64)) {
	sides := [2]func() (time.Duration, int64){base, next}
	var took [2]time.Duration
	var wal [2]int64
	b.StopTimer()
	for i := range b.N {
		for k := range sides {
			j := (i + k) % 2
			d, w := sides[j]()
			took[j] += d
			wal[j] += w
		}
	}
	rate := func(j int) float64 { return float64(rows*b.N) / took[j].Seconds() }
	b.ReportMetric(rate(0), baseName+"_"+unit+"/s")
	b.ReportMetric(rate(1), unit+"/s")
	b.ReportMetric(float64(wal[0])/float64(b.N)/(1<<20), baseName+"_wal_MiB")
	b.ReportMetric(float64(wal[1])/float64(b.N)/(1<<20), "wal_MiB")
	b.ReportMetric(rate(1)/rate(0), "speed-up")
}
