package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/refunds"
)

// statusRow is one (status, code) pair of the error table in api/README.md.
type statusRow struct {
	status int
	code   string
	when   string
}

// readmeStatusTable parses every "| status | code | when |" table of
// api/README.md (the Prefer: wait answers and the errors) into one row per
// (status, code) pair.
func readmeStatusTable(t *testing.T) []statusRow {
	t.Helper()
	md, err := os.ReadFile("README.md")
	require.NoError(t, err)
	lines := strings.Split(string(md), "\n")
	var starts []int
	for i, l := range lines {
		if strings.TrimSpace(l) == "| status | code | when |" {
			starts = append(starts, i+2) // skip the separator
		}
	}
	require.NotEmpty(t, starts, "api/README.md has no | status | code | when | table")
	codeRE := regexp.MustCompile("`([a-z_]+)`")
	var rows []statusRow
	for _, start := range starts {
		rows = append(rows, tableRows(t, lines[start:], codeRE)...)
	}
	return rows
}

// tableRows parses the rows of one table, up to its end.
func tableRows(t *testing.T, lines []string, codeRE *regexp.Regexp) []statusRow {
	var rows []statusRow
	for _, l := range lines {
		if !strings.HasPrefix(l, "|") {
			break
		}
		cells := strings.Split(strings.Trim(l, "| "), " | ")
		require.Len(t, cells, 3, "malformed row %q", l)
		status, err := strconv.Atoi(strings.TrimSpace(cells[0]))
		require.NoError(t, err, "row %q: one status per row", l)
		codes := codeRE.FindAllStringSubmatch(cells[1], -1)
		if status < 300 {
			codes = codes[:min(1, len(codes))] // an answer has one state
		}
		require.NotEmpty(t, codes, "row %q has no code", l)
		for _, c := range codes {
			rows = append(rows, statusRow{status: status, code: c[1], when: cells[2]})
		}
	}
	return rows
}

// Every row of the error table in api/README.md, driven through a real
// server (TCP, http.Server timeouts, Postgres behind a proxy): each
// (status, code) pair has a scenario here and each scenario a row there,
// so the two cannot drift apart. A row whose text mentions Retry-After or
// Allow gets the header checked too.
func TestEveryStatusInTheREADME(t *testing.T) {
	t.Parallel()
	// A generous request timeout: no row needs a short one (the database
	// "down" closes connections at once), and on a loaded machine a row's
	// ordinary request must not time out into a 503.
	b := setup(t, setupOpts{proxied: true, handler: &api.HandlerOpts{RequestTimeout: 10 * time.Second, RequestLease: time.Minute}})
	srv, err := api.NewServer("127.0.0.1:0", b.handler, &api.ServerOpts{ReadTimeout: 500 * time.Millisecond, PruneInterval: -1, Logger: b.logger})
	require.NoError(t, err)
	require.NoError(t, srv.Start(b.ctx))
	t.Cleanup(func() { _ = srv.Stop(b.ctx) })
	base := "http://" + srv.Addr()
	c := &http.Client{Timeout: 10 * time.Second}
	do := func(method, path, apiKey, idemKey, body string) response {
		return doAt(t, c, base, method, path, apiKey, idemKey, body)
	}
	post := func(idemKey, body string) response { return do("POST", "/v1/orders", b.keyA, idemKey, body) }
	valid := orderBody("ord_t", 100)
	// w is the whole path (a worker behind the API), for the Prefer: wait
	// rows, made once when the first of them runs.
	var wb *waitBundle
	w := func() *waitBundle {
		if wb == nil {
			wb = waitSetup(t)
		}
		return wb
	}

	scenarios := map[string]func() response{
		"400 missing_idempotency_key": func() response { return post("", valid) },
		"400 invalid_idempotency_key": func() response { return post("two words", valid) },
		"400 invalid_json":            func() response { return post("k-json", `{"order_id":`) },
		"400 unknown_field":           func() response { return post("k-unknown", strings.Replace(valid, `"currency"`, `"Currency"`, 1)) },
		"400 duplicate_field":         func() response { return post("k-dup", strings.Replace(valid, `"usd"`, `"usd","currency":"eur"`, 1)) },
		"400 missing_field":           func() response { return post("k-missing", `{"order_id":"ord_t"}`) },
		"400 invalid_field":           func() response { return post("k-email", strings.Replace(valid, "ada@example.com", "a@b", 1)) },
		"401 unauthorized":            func() response { return do("GET", "/v1/orders/ord_t", "", "", "") },
		"404 not_found":               func() response { return do("GET", "/v1/orders/ord_none", b.keyA, "", "") },
		"405 method_not_allowed":      func() response { return do("DELETE", "/v1/orders/ord_t", b.keyA, "", "") },
		"408 request_timeout": func() response {
			resp, body := rawHTTP(t, srv.Addr(), "POST /v1/orders HTTP/1.1\r\nHost: keyed\r\nAuthorization: Bearer "+b.keyA+
				"\r\nIdempotency-Key: k-slow\r\nContent-Length: 100\r\n\r\n{")
			return response{status: resp.StatusCode, header: resp.Header, body: []byte(body)}
		},
		"409 request_in_progress": func() response {
			release := b.holdOrder(t, b.tenantA, "ord_held")
			defer release()
			first := make(chan response, 1)
			go func() { first <- post("k-held", orderBody("ord_held", 100)) }()
			b.waitRunning(t, b.tenantA, "k-held")
			r := post("k-held", orderBody("ord_held", 100))
			release()
			<-first
			return r
		},
		"409 order_conflict": func() response {
			require.Equal(t, http.StatusCreated, post("k-c1", orderBody("ord_c", 100)).status)
			return post("k-c2", orderBody("ord_c", 101))
		},
		"409 order_not_refundable": func() response {
			require.Equal(t, http.StatusCreated, post("k-nr", orderBody("ord_nr", 100)).status)
			return do("POST", "/v1/orders/ord_nr/refunds", b.keyA, "k-nr-refund", refundBody("r1", 50, ""))
		},
		"409 refund_conflict": func() response {
			b.paidOrder(t, "ord_rc", 100)
			require.Equal(t, http.StatusAccepted, do("POST", "/v1/orders/ord_rc/refunds", b.keyA, "k-rc1", refundBody("r1", 50, "")).status)
			return do("POST", "/v1/orders/ord_rc/refunds", b.keyA, "k-rc2", refundBody("r1", 60, ""))
		},
		"422 refund_exceeds_charge": func() response {
			b.paidOrder(t, "ord_rx", 100)
			return do("POST", "/v1/orders/ord_rx/refunds", b.keyA, "k-rx", refundBody("r1", 101, ""))
		},
		"422 too_many_refunds": func() response {
			b.paidOrder(t, "ord_tm", 10_000)
			for i := range refunds.MaxPerOrder {
				b.reserve(t, "ord_tm", fmt.Sprintf("r%d", i), 1, "")
			}
			return do("POST", "/v1/orders/ord_tm/refunds", b.keyA, "k-tm", refundBody("one-more", 1, ""))
		},
		"413 body_too_large": func() response { return post("k-big", `{"order_id":"`+strings.Repeat("x", 64<<10)+`"}`) },
		"422 idempotency_key_reused": func() response {
			require.Equal(t, http.StatusCreated, post("k-reuse", orderBody("ord_r", 100)).status)
			return post("k-reuse", orderBody("ord_r", 101))
		},
		"429 rate_limited": func() response {
			keys, err := api.ParseKeys(b.keyList)
			require.NoError(t, err)
			h, err := api.NewHandler(b.pool, keys, &api.HandlerOpts{RateLimit: api.RateLimit{Rate: 0.01, Burst: 1}, Logger: b.logger})
			require.NoError(t, err)
			limited, err := api.NewServer("127.0.0.1:0", h, &api.ServerOpts{PruneInterval: -1, Logger: b.logger})
			require.NoError(t, err)
			require.NoError(t, limited.Start(b.ctx))
			defer func() { _ = limited.Stop(b.ctx) }()
			require.Equal(t, http.StatusNotFound, doAt(t, c, "http://"+limited.Addr(), "GET", "/v1/orders/ord_none", b.keyA, "", "").status)
			return doAt(t, c, "http://"+limited.Addr(), "POST", "/v1/orders", b.keyA, "k-limited", valid)
		},
		"201 paid": func() response {
			return w().post(t, w().srv.URL, "/v1/orders", "k-w-paid", orderBody("ord_w_paid", 100), "wait=10")
		},
		"201 failed": func() response {
			return w().post(t, w().srv.URL, "/v1/orders", "k-w-declined", strings.Replace(orderBody("ord_w_declined", 100), "pm_card_visa", "pm_card_chargeDeclined", 1), "wait=10")
		},
		"202 pending": func() response {
			w().w.Stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultLatency, Delay: 2 * time.Second, Match: "ord_w_slow"})
			return w().post(t, w().srv.URL, "/v1/orders", "k-w-slow", orderBody("ord_w_slow", 100), "wait=1")
		},
		"201 refunded": func() response {
			require.Equal(t, http.StatusCreated, w().post(t, w().srv.URL, "/v1/orders", "k-w-r", orderBody("ord_w_r", 100), "wait=10").status)
			return w().post(t, w().srv.URL, "/v1/orders/ord_w_r/refunds", "k-w-refund", refundBody("r1", 50, ""), "wait=10")
		},
		"500 internal": func() response {
			// A missing table is a fault of the deployment, not of the database's availability.
			require.Equal(t, http.StatusCreated, post("k-i", orderBody("ord_i", 100)).status)
			_, err := b.pool.Exec(b.ctx, `DROP TABLE keyed_outbox`)
			require.NoError(t, err)
			return do("GET", "/v1/orders/ord_i", b.keyA, "", "")
		},
		"503 unavailable": func() response {
			b.proxy.set(proxyDown)
			defer b.proxy.set(proxyForward)
			return do("GET", "/v1/orders/ord_t", b.keyA, "", "")
		},
	}

	rows := readmeStatusTable(t)
	inTable := map[string]bool{}
	for _, row := range rows {
		name := fmt.Sprintf("%d %s", row.status, row.code)
		inTable[name] = true
		scenario, ok := scenarios[name]
		require.True(t, ok, "api/README.md lists %s, which this test does not drive", name)
		r := scenario()
		require.Equal(t, row.status, r.status, "%s: %s", name, r.body)
		require.True(t, strings.HasPrefix(r.header.Get("Content-Type"), "application/json"), "%s: %s", name, r.header.Get("Content-Type"))
		if row.status < 400 {
			require.Equal(t, row.code, answerState(t, r), "%s: %s", name, r.body)
		} else {
			require.Equal(t, row.code, decodeError(t, r).Code, "%s: %s", name, r.body)
		}
		for _, h := range []string{"Retry-After", "Allow", "Location"} {
			if strings.Contains(row.when, "`"+h+"`") || strings.Contains(row.when, h) {
				require.NotEmpty(t, r.header.Get(h), "%s: the README promises %s", name, h)
			}
		}
		require.NotContains(t, string(r.body), "127.0.0.1", name)
	}
	for name := range scenarios {
		require.True(t, inTable[name], "this test drives %s, which api/README.md does not list", name)
	}
}

// answerState is the state a 2xx answer reports: its order's status, or a
// refund's state.
func answerState(t *testing.T, r response) string {
	t.Helper()
	var a struct {
		Order *struct{ Status string }
		State string
	}
	require.NoError(t, json.Unmarshal(r.body, &a), "%s", r.body)
	if a.Order != nil {
		return a.Order.Status
	}
	return a.State
}
