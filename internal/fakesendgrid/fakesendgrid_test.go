package fakesendgrid

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sendgrid/rest"
	"github.com/sendgrid/sendgrid-go"
	"github.com/sendgrid/sendgrid-go/helpers/mail"
	"github.com/stretchr/testify/require"
)

const testKey = "SG.test.key"

type bundle struct {
	srv *Server
	ts  *httptest.Server
}

func setup(t *testing.T) *bundle { return setupWith(t, nil) }

func setupWith(t *testing.T, opts *Opts) *bundle {
	t.Helper()
	srv := New(opts)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return &bundle{srv: srv, ts: ts}
}

// send posts m with sendgrid-go, the way production code does.
func (b *bundle) send(t *testing.T, key string, m *mail.SGMailV3) (*rest.Response, error) {
	t.Helper()
	req := sendgrid.GetRequest(key, "/v3/mail/send", b.ts.URL)
	req.Method = "POST"
	req.Body = mail.GetRequestBody(m)
	return sendgrid.MakeRequestWithContext(context.Background(), req)
}

// newMail returns a one-recipient plain text mail tagged with effectKey.
func newMail(effectKey string) *mail.SGMailV3 {
	m := mail.NewSingleEmailPlainText(mail.NewEmail("Shop", "shop@example.com"), "Your receipt",
		mail.NewEmail("Ann", "ann@example.com"), "Thanks for your order.")
	m.Personalizations[0].SetCustomArg("effect_key", effectKey)
	return m
}

func (s *Server) pendingFaults() []Fault { return s.faults.Pending() }

func TestSendRecordsMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := mail.NewV3Mail().SetFrom(mail.NewEmail("Shop", "shop@example.com"))
	m.Subject = "Your receipt"
	m.SetCustomArg("tenant", "t1").SetCustomArg("effect_key", "top").SetHeader("X-Top", "1")
	m.AddContent(mail.NewContent("text/html", "<p>Thanks</p>"), mail.NewContent("text/plain", "Thanks"))
	p := mail.NewPersonalization()
	p.AddTos(mail.NewEmail("Ann", "ann@example.com"), mail.NewEmail("", "bob@example.com"))
	p.SetCustomArg("effect_key", "email:order-1")
	p.SetHeader("X-Order", "order-1")
	m.AddPersonalizations(p)

	res, err := b.send(t, testKey, m)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode)
	require.Empty(t, res.Body)
	id := res.Headers["X-Message-Id"]
	require.Len(t, id, 1)
	require.Len(t, id[0], 22)

	want := Message{
		MessageID:  id[0],
		From:       "shop@example.com",
		To:         []string{"ann@example.com", "bob@example.com"},
		Subject:    "Your receipt",
		CustomArgs: map[string]string{"tenant": "t1", "effect_key": "email:order-1"},
		Headers:    map[string]string{"X-Top": "1", "X-Order": "order-1"},
		Body:       "Thanks",
	}
	require.Equal(t, []Message{want}, b.srv.Messages())
	require.Equal(t, []Message{want}, b.srv.MessagesFor("effect_key", "email:order-1"))
	require.Empty(t, b.srv.MessagesFor("effect_key", "top"))
	require.Equal(t, 1, b.srv.Count())
	require.Equal(t, 1, b.srv.Requests())
}

func TestPersonalizationsAreSeparateMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := newMail("e1")
	p := mail.NewPersonalization()
	p.AddTos(mail.NewEmail("", "cy@example.com"))
	p.Subject = "Override"
	p.SetCustomArg("effect_key", "e2")
	m.AddPersonalizations(p)

	res, err := b.send(t, testKey, m)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode)

	msgs := b.srv.Messages()
	require.Len(t, msgs, 2)
	require.Equal(t, msgs[0].MessageID, msgs[1].MessageID)
	require.Equal(t, "Your receipt", msgs[0].Subject)
	require.Equal(t, "Override", msgs[1].Subject)
	require.Equal(t, []string{"cy@example.com"}, msgs[1].To)
	require.Equal(t, Stats{Count: 2, Requests: 1, ByEffectKey: map[string]int{"e1": 1, "e2": 1}}, b.srv.Stats())
}

func TestTemplate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := mail.NewV3Mail().SetFrom(mail.NewEmail("", "shop@example.com")).SetTemplateID("d-123")
	p := mail.NewPersonalization()
	p.AddTos(mail.NewEmail("", "ann@example.com"))
	p.SetDynamicTemplateData("order", "order-1")
	m.AddPersonalizations(p)

	res, err := b.send(t, testKey, m)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode)
	got := b.srv.Messages()[0]
	require.Equal(t, "d-123", got.TemplateID)
	require.Equal(t, map[string]any{"order": "order-1"}, got.TemplateData)
	require.Empty(t, got.Subject)
}

func TestValidation(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mutate func(*mail.SGMailV3)
		fields []string
	}{
		"no personalizations": {func(m *mail.SGMailV3) { m.Personalizations = nil }, []string{"personalizations"}},
		"no recipients":       {func(m *mail.SGMailV3) { m.Personalizations[0].To = nil }, []string{"personalizations.0.to"}},
		"bad recipient": {func(m *mail.SGMailV3) { m.Personalizations[0].To[0].Address = "nobody" },
			[]string{"personalizations.0.to.0.email"}},
		"no from":        {func(m *mail.SGMailV3) { m.From = nil }, []string{"from"}},
		"bad from":       {func(m *mail.SGMailV3) { m.From.Address = "shop" }, []string{"from.email"}},
		"no subject":     {func(m *mail.SGMailV3) { m.Subject = "" }, []string{"subject"}},
		"no content":     {func(m *mail.SGMailV3) { m.Content = nil }, []string{"content"}},
		"everything":     {func(m *mail.SGMailV3) { *m = mail.SGMailV3{} }, []string{"personalizations", "content", "from"}},
		"no to, no from": {func(m *mail.SGMailV3) { m.Personalizations[0].To = nil; m.From = nil }, []string{"personalizations.0.to", "from"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			m := newMail("e1")
			tc.mutate(m)

			res, err := b.send(t, testKey, m)
			require.NoError(t, err, "sendgrid-go reports HTTP errors only via StatusCode")
			require.Equal(t, http.StatusBadRequest, res.StatusCode)
			var fields []string
			for _, f := range strings.Split(res.Body, `"field":"`)[1:] {
				fields = append(fields, f[:strings.IndexByte(f, '"')])
			}
			require.ElementsMatch(t, tc.fields, fields, res.Body)
			require.Zero(t, b.srv.Count())
		})
	}
}

func TestBadJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	req := sendgrid.GetRequest(testKey, "/v3/mail/send", b.ts.URL)
	req.Method = "POST"
	req.Body = []byte(`{"personalizations": [`)
	res, err := sendgrid.MakeRequestWithContext(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.JSONEq(t, `{"errors":[{"field":null,"message":"Bad Request","help":null}]}`, res.Body)
}

func TestAuth(t *testing.T) {
	t.Parallel()
	b := setupWith(t, &Opts{APIKey: testKey})

	res, err := b.send(t, "", newMail("e1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	require.Contains(t, res.Body, `"errors"`)

	res, err = b.send(t, "SG.wrong", newMail("e1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	require.Zero(t, b.srv.Count())

	res, err = b.send(t, testKey, newMail("e1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode)
}

func TestGzipBody(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := &sendgrid.Client{Request: sendgrid.GetRequest(testKey, "/v3/mail/send", b.ts.URL)}
	c.Method = "POST"
	c.Headers["Content-Encoding"] = "gzip"

	res, err := c.SendWithContext(context.Background(), newMail("e1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode)
	require.Len(t, b.srv.MessagesFor("effect_key", "e1"), 1)
}

func TestNoIdempotency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 2 {
		res, err := b.send(t, testKey, newMail("e1"))
		require.NoError(t, err)
		require.Equal(t, http.StatusAccepted, res.StatusCode)
	}
	msgs := b.srv.MessagesFor("effect_key", "e1")
	require.Len(t, msgs, 2)
	require.NotEqual(t, msgs[0].MessageID, msgs[1].MessageID)
}

func TestDropResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultDropResponse})

	_, err := b.send(t, testKey, newMail("e1"))
	require.Error(t, err)
	require.Equal(t, 1, b.srv.Count(), "the message was accepted before the drop")

	// A blind retry sends the email again: SendGrid does not deduplicate.
	res, err := b.send(t, testKey, newMail("e1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode)
	require.Equal(t, 2, b.srv.Stats().ByEffectKey["e1"])
}

func TestServerError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultServerError})

	res, err := b.send(t, testKey, newMail("e1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, res.StatusCode)
	require.Zero(t, b.srv.Count())

	res, err = b.send(t, testKey, newMail("e1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode)
	require.Equal(t, 1, b.srv.Count())
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultRateLimit})

	res, err := b.send(t, testKey, newMail("e1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	require.NotEmpty(t, res.Headers["X-Ratelimit-Reset"])
	require.Zero(t, b.srv.Count())

	// sendgrid-go's retrying variant waits until X-RateLimit-Reset.
	b.srv.Inject(Fault{Kind: FaultRateLimit})
	req := sendgrid.GetRequest(testKey, "/v3/mail/send", b.ts.URL)
	req.Method = "POST"
	req.Body = mail.GetRequestBody(newMail("e2"))
	res, err = sendgrid.MakeRequestRetryWithContext(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode)
	require.Equal(t, 1, b.srv.Count())
	require.Equal(t, 3, b.srv.Requests())
}

func TestFaultMatchAndLatency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultLatency, Delay: 50 * time.Millisecond, Match: "slow"})

	res, err := b.send(t, testKey, newMail("fast"))
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode)
	require.Len(t, b.srv.pendingFaults(), 1)

	start := time.Now()
	res, err = b.send(t, testKey, newMail("slow"))
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	require.Empty(t, b.srv.pendingFaults())
	require.Equal(t, 2, b.srv.Count())
}

func TestAdminEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	do := func(method, path, body string) (int, string) {
		req, err := http.NewRequest(method, b.ts.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		res, err := b.ts.Client().Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		out, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(out)
	}

	status, _ := do("POST", "/_fake/faults", `{"kind":"server_error","times":2,"delay":1000}`)
	require.Equal(t, http.StatusNoContent, status)
	status, _ = do("POST", "/_fake/faults", `{"kind":"nope"}`)
	require.Equal(t, http.StatusBadRequest, status)
	// The fake does not implement hold_response, so it refuses it.
	status, _ = do("POST", "/_fake/faults", `{"kind":"hold_response"}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, []Fault{{Kind: FaultServerError, Times: 2, Delay: time.Microsecond}}, b.srv.pendingFaults())
	for _, want := range []int{500, 500, 202} {
		res, err := b.send(t, testKey, newMail("e1"))
		require.NoError(t, err)
		require.Equal(t, want, res.StatusCode)
	}

	status, body := do("GET", "/_fake/stats", "")
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, `{"count":1,"requests":3,"lookups":0,"by_effect_key":{"e1":1}}`, body)
	status, body = do("GET", "/_fake/messages", "")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `"effect_key":"e1"`)

	status, _ = do("POST", "/_fake/reset", "")
	require.Equal(t, http.StatusNoContent, status)
	require.Equal(t, Stats{ByEffectKey: map[string]int{}}, b.srv.Stats())
}

func TestConcurrentSends(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultServerError, Times: 5})

	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			res, err := b.send(t, testKey, newMail(fmt.Sprint("e", i)))
			if err != nil || res.StatusCode != http.StatusAccepted && res.StatusCode != http.StatusInternalServerError {
				t.Errorf("send %d: %v %v", i, res, err)
			}
		})
	}
	wg.Wait()
	require.Equal(t, 25, b.srv.Count())
	require.Equal(t, 30, b.srv.Requests())
}
