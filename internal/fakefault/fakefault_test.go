package fakefault

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestUnmarshalJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		want     Fault
	}{
		{"duration string", `{"kind":"latency","delay":"250ms"}`, Fault{Kind: FaultLatency, Delay: 250 * time.Millisecond}},
		{"nanoseconds", `{"kind":"server_error","times":2,"delay":1000}`, Fault{Kind: FaultServerError, Times: 2, Delay: time.Microsecond}},
		{"no delay", `{"kind":"rate_limit","match":"order-7"}`, Fault{Kind: FaultRateLimit, Match: "order-7"}},
		{"null delay", `{"kind":"drop_response","delay":null}`, Fault{Kind: FaultDropResponse}},
		{"hold response", `{"kind":"hold_response","delay":"20s"}`, Fault{Kind: FaultHoldResponse, Delay: 20 * time.Second}},
		{"rate", `{"kind":"drop_response","rate":0.1}`, Fault{Kind: FaultDropResponse, Rate: 0.1}},
		{"rate with times", `{"kind":"server_error","rate":1,"times":3}`, Fault{Kind: FaultServerError, Rate: 1, Times: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got Fault
			require.NoError(t, json.Unmarshal([]byte(tc.in), &got))
			require.Equal(t, tc.want, got)
		})
	}
}

func TestUnmarshalJSONErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, want string
	}{
		{"unknown kind", `{"kind":"explode"}`, `fakefault: unknown fault kind "explode"`},
		{"missing kind", `{"times":1}`, `fakefault: unknown fault kind ""`},
		{"bad duration", `{"kind":"latency","delay":"soon"}`, `time: invalid duration "soon"`},
		{"bad delay type", `{"kind":"latency","delay":true}`, `fakefault: bad delay true`},
		{"bad times", `{"kind":"latency","times":"2"}`, `cannot unmarshal`},
		{"not an object", `[]`, `cannot unmarshal`},
		{"rate above 1", `{"kind":"rate_limit","rate":1.5}`, `fakefault: rate 1.5 is not within [0, 1]`},
		{"negative rate", `{"kind":"rate_limit","rate":-0.1}`, `fakefault: rate -0.1 is not within [0, 1]`},
		{"negative times", `{"kind":"rate_limit","times":-1}`, `fakefault: negative times -1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got Fault
			err := json.Unmarshal([]byte(tc.in), &got)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	t.Parallel()
	in := Fault{Kind: FaultLatency, Times: 3, Delay: 5 * time.Millisecond, Match: "k"}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	require.JSONEq(t, `{"kind":"latency","times":3,"delay":5000000,"match":"k"}`, string(b))
	var out Fault
	require.NoError(t, json.Unmarshal(b, &out))
	require.Equal(t, in, out)
}

func TestSupported(t *testing.T) {
	t.Parallel()
	f := Fault{Kind: FaultHoldResponse}
	require.NoError(t, f.Supported(FaultLatency, FaultHoldResponse))
	require.EqualError(t, f.Supported(FaultLatency, FaultServerError),
		`fakefault: fault kind "hold_response" is not implemented by this fake`)
}

func TestQueueTake(t *testing.T) {
	t.Parallel()
	var q Queue
	_, ok := q.Take("anything")
	require.False(t, ok)

	q.Inject(Fault{Kind: FaultServerError, Match: "order-7"})
	q.Inject(Fault{Kind: FaultRateLimit, Times: 2})
	require.Equal(t, []Fault{{Kind: FaultServerError, Times: 1, Match: "order-7"}, {Kind: FaultRateLimit, Times: 2}}, q.Pending())

	// A subject not containing Match skips the first fault.
	f, ok := q.Take("order-8")
	require.True(t, ok)
	require.Equal(t, Fault{Kind: FaultRateLimit, Times: 2}, f)
	require.Equal(t, []Fault{{Kind: FaultServerError, Times: 1, Match: "order-7"}, {Kind: FaultRateLimit, Times: 1}}, q.Pending())

	// Faults are taken in injection order, Match as a substring.
	f, ok = q.Take("charge:order-7:1")
	require.True(t, ok)
	require.Equal(t, FaultServerError, f.Kind)
	f, ok = q.Take("charge:order-7:1")
	require.True(t, ok)
	require.Equal(t, FaultRateLimit, f.Kind)

	_, ok = q.Take("order-7")
	require.False(t, ok)
	require.Empty(t, q.Pending())
}

func TestQueuePendingIsACopy(t *testing.T) {
	t.Parallel()
	var q Queue
	q.Inject(Fault{Kind: FaultLatency})
	p := q.Pending()
	p[0].Kind = FaultServerError
	require.Equal(t, []Fault{{Kind: FaultLatency, Times: 1}}, q.Pending())
}

func TestQueueReset(t *testing.T) {
	t.Parallel()
	var q Queue
	q.Inject(Fault{Kind: FaultLatency, Times: 3})
	q.Reset()
	require.Empty(t, q.Pending())
	_, ok := q.Take("")
	require.False(t, ok)
}

func TestQueueConcurrent(t *testing.T) {
	t.Parallel()
	var q Queue
	q.Inject(Fault{Kind: FaultServerError, Times: 25})
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		taken int
	)
	for range 100 {
		wg.Go(func() {
			if _, ok := q.Take("s"); ok {
				mu.Lock()
				taken++
				mu.Unlock()
			}
			q.Pending()
		})
	}
	wg.Wait()
	require.Equal(t, 25, taken)
	require.Empty(t, q.Pending())
}

func TestRegisterAdmin(t *testing.T) {
	t.Parallel()
	var (
		q      Queue
		resets int
	)
	mux := http.NewServeMux()
	RegisterAdmin(mux, []FaultKind{FaultServerError, FaultLatency}, func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, `{"ok":true}`)
	}, q.Inject, func() { resets++; q.Reset() })
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	do := func(method, path, body string) (int, string) {
		req, err := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		res, err := ts.Client().Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		out, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(out)
	}

	status, body := do("GET", "/_fake/stats", "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, `{"ok":true}`, body)

	status, _ = do("POST", "/_fake/faults", `{"kind":"server_error","times":2,"match":"x"}`)
	require.Equal(t, http.StatusNoContent, status)
	status, _ = do("POST", "/_fake/faults", `{"kind":"latency","delay":"5ms"}`)
	require.Equal(t, http.StatusNoContent, status)
	status, body = do("POST", "/_fake/faults", `{"kind":"explode"}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "unknown fault kind")
	status, body = do("POST", "/_fake/faults", `{"kind":"hold_response"}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "not implemented")
	status, _ = do("POST", "/_fake/faults", `{"kind":`)
	require.Equal(t, http.StatusBadRequest, status)
	status, body = do("POST", "/_fake/faults", `{"kind":"latency","rate":7}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "not within [0, 1]")
	require.Equal(t, []Fault{{Kind: FaultServerError, Times: 2, Match: "x"}, {Kind: FaultLatency, Times: 1, Delay: 5 * time.Millisecond}}, q.Pending())

	status, _ = do("GET", "/_fake/faults", "")
	require.Equal(t, http.StatusMethodNotAllowed, status)

	status, _ = do("POST", "/_fake/reset", "")
	require.Equal(t, http.StatusNoContent, status)
	require.Equal(t, 1, resets)
	require.Empty(t, q.Pending())
}

// seq returns a draw function that yields vals in turn.
func seq(vals ...float64) func() float64 {
	return func() float64 {
		v := vals[0]
		vals = vals[1:]
		return v
	}
}

func TestQueueRates(t *testing.T) {
	t.Parallel()
	q := Queue{rand: seq(0.05, 0.12, 0.17, 0.5, 0.0)}
	q.Inject(Fault{Kind: FaultDropResponse, Rate: 0.10})
	q.Inject(Fault{Kind: FaultServerError, Rate: 0.05})
	q.Inject(Fault{Kind: FaultRateLimit, Rate: 0.05, Match: "send"})
	q.Inject(Fault{Kind: FaultLatency, Rate: 0.5, Match: "other"})

	// One draw per request; the matching rates add up in queue order.
	for _, want := range []FaultKind{FaultDropResponse, FaultServerError, FaultRateLimit} {
		f, ok := q.Take("send")
		require.True(t, ok)
		require.Equal(t, want, f.Kind)
	}
	_, ok := q.Take("send") // 0.5 is above 0.10+0.05+0.05
	require.False(t, ok)

	// Rate faults stay queued without a limit.
	require.Len(t, q.Pending(), 4)
	for _, f := range q.Pending() {
		require.Zero(t, f.Times)
	}
	// A subject draws among the rate faults it matches only.
	f, ok := q.Take("")
	require.True(t, ok)
	require.Equal(t, FaultDropResponse, f.Kind)
}

func TestQueueCountedBeforeRates(t *testing.T) {
	t.Parallel()
	q := Queue{rand: func() float64 { return 0 }}
	q.Inject(Fault{Kind: FaultDropResponse, Rate: 1})
	q.Inject(Fault{Kind: FaultServerError, Match: "order-7"})

	f, ok := q.Take("order-7")
	require.True(t, ok)
	require.Equal(t, FaultServerError, f.Kind, "a counted fault is taken before any rate fault")
	f, ok = q.Take("order-7")
	require.True(t, ok)
	require.Equal(t, FaultDropResponse, f.Kind)
	require.Equal(t, []Fault{{Kind: FaultDropResponse, Rate: 1}}, q.Pending())
}

func TestQueueRateTimes(t *testing.T) {
	t.Parallel()
	q := Queue{rand: func() float64 { return 0.5 }}
	q.Inject(Fault{Kind: FaultRateLimit, Rate: 0.9, Times: 2})
	for range 2 {
		f, ok := q.Take("s")
		require.True(t, ok)
		require.Equal(t, FaultRateLimit, f.Kind)
	}
	_, ok := q.Take("s")
	require.False(t, ok, "a rate fault leaves the queue after Times applications")
	require.Empty(t, q.Pending())
}

func TestQueueRateFrequency(t *testing.T) {
	t.Parallel()
	var q Queue
	q.Inject(Fault{Kind: FaultDropResponse, Rate: 0.10})
	q.Inject(Fault{Kind: FaultServerError, Rate: 0.05})
	const n = 20000
	got := map[FaultKind]int{}
	for range n {
		if f, ok := q.Take("s"); ok {
			got[f.Kind]++
		}
	}
	// Binomial standard deviations are about 42 and 31; allow 5 of them.
	require.InDelta(t, 0.10*n, got[FaultDropResponse], 210)
	require.InDelta(t, 0.05*n, got[FaultServerError], 155)
}

func TestInjectRefusesBadFaults(t *testing.T) {
	t.Parallel()
	var q Queue
	require.PanicsWithError(t, "fakefault: rate 2 is not within [0, 1]", func() { q.Inject(Fault{Kind: FaultLatency, Rate: 2}) })
	require.PanicsWithError(t, "fakefault: negative times -3", func() { q.Inject(Fault{Kind: FaultLatency, Times: -3}) })
	require.Empty(t, q.Pending())
}
