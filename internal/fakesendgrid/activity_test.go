package fakesendgrid

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sendgrid/sendgrid-go"
	"github.com/sendgrid/sendgrid-go/helpers/mail"
	"github.com/stretchr/testify/require"
)

// lookup queries the Email Activity API with sendgrid-go, the way
// production code does, and returns the status and the decoded messages.
func (b *bundle) lookup(t *testing.T, key string, params map[string]string) (int, []ActivityMessage, string) {
	t.Helper()
	req := sendgrid.GetRequest(key, "/v3/messages", b.ts.URL)
	req.Method = "GET"
	req.QueryParams = params
	res, err := sendgrid.MakeRequestWithContext(context.Background(), req)
	require.NoError(t, err)
	var out struct {
		Messages []ActivityMessage `json:"messages"`
	}
	if res.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal([]byte(res.Body), &out), res.Body)
		require.NotNil(t, out.Messages, "messages is [] rather than null when empty")
	}
	return res.StatusCode, out.Messages, res.Body
}

func byKey(key string) map[string]string {
	return map[string]string{"query": `(unique_args['effect_key']="` + key + `")`, "limit": "10"}
}

func (b *bundle) mustSend(t *testing.T, m *mail.SGMailV3) string {
	t.Helper()
	res, err := b.send(t, testKey, m)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode, res.Body)
	return res.Headers["X-Message-Id"][0]
}

func TestActivityFindsByCustomArg(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.mustSend(t, newMail("acme:order:1:receipt"))
	b.mustSend(t, newMail("acme:order:2:receipt"))

	status, msgs, body := b.lookup(t, testKey, byKey("acme:order:1:receipt"))
	require.Equal(t, http.StatusOK, status, body)
	require.Len(t, msgs, 1)
	m := msgs[0]
	require.True(t, strings.HasPrefix(m.MsgID, id+"."), "msg_id %q starts with the X-Message-Id", m.MsgID)
	require.Equal(t, "ann@example.com", m.ToEmail)
	require.Equal(t, "shop@example.com", m.FromEmail)
	require.Equal(t, "Your receipt", m.Subject)
	require.Equal(t, "processed", m.Status)
	_, err := time.Parse(time.RFC3339, m.LastEventTime)
	require.NoError(t, err)

	status, msgs, _ = b.lookup(t, testKey, byKey("acme:order:3:receipt"))
	require.Equal(t, http.StatusOK, status)
	require.Empty(t, msgs)
	require.Equal(t, 2, b.srv.Lookups())
	require.Equal(t, 2, b.srv.Stats().Lookups)
	require.Equal(t, 2, b.srv.Count(), "look-ups send nothing")
}

func TestActivityIndexLag(t *testing.T) {
	t.Parallel()
	b := setupWith(t, &Opts{IndexLag: 400 * time.Millisecond})
	b.mustSend(t, newMail("e1"))

	_, msgs, _ := b.lookup(t, testKey, byKey("e1"))
	require.Empty(t, msgs, "not indexed yet")
	require.Empty(t, b.srv.Indexed("effect_key", "e1"))
	require.Len(t, b.srv.MessagesFor("effect_key", "e1"), 1, "but accepted")

	require.Eventually(t, func() bool {
		_, msgs, _ := b.lookup(t, testKey, byKey("e1"))
		return len(msgs) == 1
	}, 5*time.Second, 50*time.Millisecond)
	require.Len(t, b.srv.Indexed("effect_key", "e1"), 1)

	// A longer lag hides it again; zero shows everything at once.
	b.srv.SetIndexLag(time.Hour)
	require.Empty(t, b.srv.Indexed("effect_key", "e1"))
	b.srv.SetIndexLag(0)
	require.Len(t, b.srv.Indexed("effect_key", "e1"), 1)
}

func TestActivityQuery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := newMail(`we"ird\key`)
	m.Personalizations[0].AddTos(mail.NewEmail("", "bob@example.com"))
	id := b.mustSend(t, m)
	b.mustSend(t, newMail("e2"))
	b.mustSend(t, newMail("e3"))

	count := func(query, limit string) int {
		t.Helper()
		params := map[string]string{"query": query}
		if limit != "" {
			params["limit"] = limit
		}
		status, msgs, body := b.lookup(t, testKey, params)
		require.Equal(t, http.StatusOK, status, "%s: %s", query, body)
		return len(msgs)
	}
	require.Equal(t, 2, count(`unique_args['effect_key']="we\"ird\\key"`, ""), "one entry per recipient")
	require.Equal(t, 1, count(`(unique_args['effect_key']="we\"ird\\key") AND (to_email="bob@example.com")`, ""))
	require.Equal(t, 1, count(`unique_args['effect_key']="we\"ird\\key" and to_email!="bob@example.com"`, ""))
	require.Equal(t, 4, count(`subject="Your receipt"`, ""))
	require.Equal(t, 2, count(`subject="Your receipt"`, "2"))
	require.Equal(t, 4, count(``, ""), "no query lists the most recent")
	require.Equal(t, 0, count(`unique_args['other']="e2"`, ""))
	require.Equal(t, 1, count(`status="processed" AND from_email="shop@example.com" AND unique_args['effect_key']="e3"`, ""))

	_, msgs, _ := b.lookup(t, testKey, map[string]string{"query": `subject="Your receipt"`, "limit": "1"})
	require.Len(t, msgs, 1)
	require.True(t, strings.HasPrefix(msgs[0].MsgID, b.srv.Messages()[2].MessageID+"."), "the last one sent (e3)")
	_, byID, _ := b.lookup(t, testKey, map[string]string{"query": `msg_id="` + msgs[0].MsgID + `"`})
	require.Equal(t, msgs, byID, "most recent first, and msg_id is queryable")
	require.NotContains(t, msgs[0].MsgID, id)

	for query, field := range map[string]string{
		`effect_key="e2"`:                    "query",
		`unique_args['effect_key']=e2`:       "query",
		`unique_args['effect_key']="e2`:      "query",
		`subject="a" OR subject="b"`:         "query",
		`subject LIKE "a%"`:                  "query",
		`(subject="a"`:                       "query",
		`unique_args[effect_key]="e2"`:       "query",
		`unique_args['effect_key']="e2" AND`: "query",
	} {
		status, _, body := b.lookup(t, testKey, map[string]string{"query": query})
		require.Equal(t, http.StatusBadRequest, status, query)
		require.Contains(t, body, `"field":"`+field+`"`, query)
	}
	for _, limit := range []string{"0", "1001", "ten"} {
		status, _, body := b.lookup(t, testKey, map[string]string{"limit": limit})
		require.Equal(t, http.StatusBadRequest, status, limit)
		require.Contains(t, body, `"field":"limit"`)
	}
}

func TestActivityFaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.mustSend(t, newMail("e1"))

	b.srv.InjectLookup(Fault{Kind: FaultServerError})
	b.srv.InjectLookup(Fault{Kind: FaultRateLimit, Match: "e1"})
	status, _, _ := b.lookup(t, testKey, byKey("e1"))
	require.Equal(t, http.StatusInternalServerError, status)
	status, _, _ = b.lookup(t, testKey, byKey("other"))
	require.Equal(t, http.StatusOK, status, "the rate limit matches e1 only")
	status, _, _ = b.lookup(t, testKey, byKey("e1"))
	require.Equal(t, http.StatusTooManyRequests, status)
	status, msgs, _ := b.lookup(t, testKey, byKey("e1"))
	require.Equal(t, http.StatusOK, status)
	require.Len(t, msgs, 1)

	// Look-up faults and mail send faults are separate queues.
	b.srv.Inject(Fault{Kind: FaultServerError})
	status, _, _ = b.lookup(t, testKey, byKey("e1"))
	require.Equal(t, http.StatusOK, status)
	require.Len(t, b.srv.pendingFaults(), 1)
	b.srv.Reset()

	// Times 2: Go's transport may retry an idempotent GET once on a reused
	// connection.
	b.srv.InjectLookup(Fault{Kind: FaultDropResponse, Times: 2})
	req := sendgrid.GetRequest(testKey, "/v3/messages", b.ts.URL)
	req.QueryParams = byKey("e1")
	_, err := sendgrid.MakeRequestWithContext(context.Background(), req)
	require.Error(t, err, "the connection is dropped")
	b.srv.lookupFaults.Reset()

	b.srv.SetLookupOutage(true)
	for range 3 {
		status, _, _ = b.lookup(t, testKey, byKey("e1"))
		require.Equal(t, http.StatusServiceUnavailable, status)
	}
	b.mustSend(t, newMail("e2")) // Mail send still works.
	b.srv.SetLookupOutage(false)
	status, msgs, _ = b.lookup(t, testKey, byKey("e2"))
	require.Equal(t, http.StatusOK, status)
	require.Len(t, msgs, 1)
	require.GreaterOrEqual(t, b.srv.Lookups(), 5)
}

func TestActivityAuth(t *testing.T) {
	t.Parallel()
	b := setupWith(t, &Opts{APIKey: testKey})
	status, _, _ := b.lookup(t, "SG.wrong", byKey("e1"))
	require.Equal(t, http.StatusUnauthorized, status)
	status, _, _ = b.lookup(t, testKey, byKey("e1"))
	require.Equal(t, http.StatusOK, status)

	nb := setupWith(t, &Opts{NoActivityAccess: true})
	status, _, body := nb.lookup(t, testKey, byKey("e1"))
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, body, "access forbidden")
}

func TestActivityAdminEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	post := func(path, body string) int {
		res, err := b.ts.Client().Post(b.ts.URL+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer res.Body.Close()
		_, err = io.Copy(io.Discard, res.Body)
		require.NoError(t, err)
		return res.StatusCode
	}
	require.Equal(t, http.StatusNoContent, post("/_fake/lookup-faults", `{"kind":"rate_limit","times":2}`))
	require.Equal(t, http.StatusBadRequest, post("/_fake/lookup-faults", `{"kind":"hold_response"}`))
	require.Equal(t, http.StatusBadRequest, post("/_fake/lookup-faults", `{"kind":"nope"}`))
	for _, want := range []int{429, 429, 200} {
		status, _, _ := b.lookup(t, testKey, byKey("e1"))
		require.Equal(t, want, status)
	}
	require.Equal(t, http.StatusNoContent, post("/_fake/lookup-outage", `{"on":true}`))
	status, _, _ := b.lookup(t, testKey, byKey("e1"))
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Equal(t, http.StatusNoContent, post("/_fake/lookup-outage", `{"on":false}`))
	status, _, _ = b.lookup(t, testKey, byKey("e1"))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, http.StatusBadRequest, post("/_fake/lookup-outage", `nope`))

	// Reset ends an outage.
	b.srv.SetLookupOutage(true)
	require.Equal(t, http.StatusNoContent, post("/_fake/reset", ``))
	status, _, _ = b.lookup(t, testKey, byKey("e1"))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, 1, b.srv.Lookups())
}
