package tests

import (
	"bufio"
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// serverCalls is the dev server's count of the calls its services served
// (service_requests) and made to its store (persistence_requests), by
// service and operation, read from its metrics.
type serverCalls map[string]float64

// callLine matches a request counter: its metric, labels and value.
var callLine = regexp.MustCompile(`^(service|persistence|visibility_persistence|task)_requests\{([^}]*)\} ([0-9.e+]+)$`)

var callLabel = regexp.MustCompile(`(operation|service_name)="([^"]*)"`)

// readServerCalls reads the shared dev server's request counters once they
// have settled: the server publishes them a moment after the calls, so a
// read right after a burst of calls (the harness's history reads after a
// round) would leave them to the next batch's count. It reads until two
// reads a second apart agree, five times at most.
func readServerCalls(b testing.TB) serverCalls {
	b.Helper()
	calls := scrapeServerCalls(b)
	for range 5 {
		time.Sleep(time.Second)
		next := scrapeServerCalls(b)
		if maps.Equal(next, calls) {
			break
		}
		calls = next
	}
	return calls
}

// scrapeServerCalls reads the dev server's request counters as they are.
func scrapeServerCalls(b testing.TB) serverCalls {
	b.Helper()
	resp, err := http.Get(temporalMetrics)
	require.NoError(b, err, "read the dev server's metrics")
	defer resp.Body.Close()
	calls := serverCalls{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := callLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range callLabel.FindAllStringSubmatch(m[2], -1) {
			labels[l[1]] = l[2]
		}
		v, err := strconv.ParseFloat(m[3], 64)
		require.NoError(b, err)
		kind := labels["service_name"]
		switch m[1] {
		case "persistence":
			kind = "store"
		case "visibility_persistence":
			kind = "visibility"
		case "task":
			kind = "task"
		}
		calls[kind+" "+labels["operation"]] += v
	}
	require.NoError(b, sc.Err())
	return calls
}

// perRun returns the calls made since before, divided by runs.
func (c serverCalls) perRun(before serverCalls, runs int) serverCalls {
	out := serverCalls{}
	for k, v := range c {
		if d := (v - before[k]) / float64(runs); d > 0 {
			out[k] = d
		}
	}
	return out
}

// String gives each service's calls per run, then the operations of at
// least 0.5 per run, most first.
func (c serverCalls) String() string {
	services := map[string]float64{}
	var ops []string
	for k, v := range c {
		svc, _, _ := strings.Cut(k, " ")
		services[svc] += v
		if v >= 0.5 {
			ops = append(ops, k)
		}
	}
	slices.SortFunc(ops, func(x, y string) int { return cmp.Or(cmp.Compare(c[y], c[x]), strings.Compare(x, y)) })
	var sb strings.Builder
	for _, svc := range []string{"frontend", "history", "matching", "store"} {
		fmt.Fprintf(&sb, "%s %.1f, ", svc, services[svc])
	}
	sb.WriteString("of them:")
	for _, op := range ops {
		fmt.Fprintf(&sb, " %s %.1f;", op, c[op])
	}
	return strings.TrimSuffix(sb.String(), ";")
}
