package notify

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/mail"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sendgrid/rest"
	"github.com/sendgrid/sendgrid-go"
	sgmail "github.com/sendgrid/sendgrid-go/helpers/mail"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/tracing"
)

// Policy says what a send does when an earlier attempt claimed it and never
// reported back, and SendGrid's Email Activity API cannot say whether that
// attempt's email went out. See the package doc.
type Policy string

// The delivery policies.
const (
	// AtMostOnce never sends without evidence that no earlier attempt's
	// email is at SendGrid: when the look-up keeps failing until the send
	// timeout plus LookupLag+LookupGiveUp after the earlier POST, the record
	// fails as "ambiguous" for an operator.
	AtMostOnce Policy = "at_most_once"
	// AtLeastOnce prefers a second copy to no email: when the look-up keeps
	// failing for as long, it sends again.
	AtLeastOnce Policy = "at_least_once"
)

// Valid reports whether p is one of the defined policies.
func (p Policy) Valid() bool { return p == AtMostOnce || p == AtLeastOnce }

// Defaults of SenderOpts.
const (
	// DefaultCollapseWindow is how long a send blocks a repeat to the same
	// recipient about the same entity with the same template.
	DefaultCollapseWindow = 10 * time.Minute
	// DefaultBaseURL is SendGrid's global API host.
	DefaultBaseURL = "https://api.sendgrid.com"
	// DefaultTimeout bounds one mail send request when SenderOpts.HTTPClient
	// is nil or has no Timeout.
	DefaultTimeout = 30 * time.Second
	// DefaultLookupLag is how long an accepted message may take to appear in
	// SendGrid's Email Activity index (SendGrid publishes no bound).
	DefaultLookupLag = 5 * time.Minute
	// DefaultLookupTimeout bounds one Email Activity request.
	DefaultLookupTimeout = 10 * time.Second
	// DefaultLookupGiveUp is how long past the lag window a failing look-up is
	// retried before the policy decides.
	DefaultLookupGiveUp = 4 * time.Minute
)

// HeaderEffectKey is the email header that carries the effect key.
const HeaderEffectKey = "X-Keyed-Effect-Key"

// Provider is the step.Declaration.Provider of every step that sends
// through SendGrid.
const Provider = "sendgrid"

// CustomArgEffectKey is the SendGrid custom argument that carries the effect
// key, so that SendGrid's event webhook reports it back.
const CustomArgEffectKey = "effect_key"

const sendPath = "/v3/mail/send"

// SenderOpts configures a Sender. APIKey and From are required.
type SenderOpts struct {
	// APIKey is the SendGrid API key. Required; never logged.
	APIKey string
	// BaseURL is the SendGrid API host. Empty means DefaultBaseURL.
	BaseURL string
	// From is the sender address, "receipts@example.com" or
	// "Example <receipts@example.com>". Required.
	From string
	// CollapseWindow is how long a send drops repeats to the same recipient,
	// template and entity. Zero means DefaultCollapseWindow.
	CollapseWindow time.Duration
	// Policies maps a template to its policy. Templates not listed are
	// AtMostOnce.
	Policies map[string]Policy
	// HTTPClient sends the requests. Nil means a client with DefaultTimeout.
	// Its Timeout (DefaultTimeout if zero) also bounds each mail send
	// request, which dates the latest moment SendGrid may have accepted it.
	HTTPClient *http.Client
	// LookupLag is how long SendGrid's index may take to show an accepted
	// message: a retry whose earlier POST started less than the send timeout plus
	// LookupLag ago, finding nothing, waits instead of sending. Zero means
	// DefaultLookupLag. The send timeout plus LookupLag must not exceed the
	// collapse window.
	LookupLag time.Duration
	// LookupTimeout bounds one Email Activity request. Zero means
	// DefaultLookupTimeout.
	LookupTimeout time.Duration
	// LookupGiveUp is how long past LookupLag a failing look-up (an outage,
	// 5xx, 429, 403) keeps the send waiting; after it AtMostOnce fails as
	// ambiguous and AtLeastOnce sends. Zero means DefaultLookupGiveUp.
	LookupGiveUp time.Duration
	// Logger receives one record per send outcome. Nil means slog.Default().
	Logger *slog.Logger
}

// Sender sends emails through SendGrid as keyed effects. It is safe for
// concurrent use.
type Sender struct {
	claims   *effects.Client
	db       effects.DB
	apiKey   string
	baseURL  string
	from     *sgmail.Email
	window   time.Duration
	policies map[string]Policy
	http     *rest.Client
	logger   *slog.Logger
	lookup   lookupOpts
	// sendTimeout bounds each mail send request.
	sendTimeout time.Duration
}

// NewSender returns a Sender that claims its sends through claims and keeps
// its collapse window in db (keyed's migrations applied). It returns an error
// for a nil claims or db, a missing API key or From, a bad From or BaseURL, a
// negative duration, a send timeout plus LookupLag over the collapse window,
// or an unknown policy.
func NewSender(claims *effects.Client, db effects.DB, opts *SenderOpts) (*Sender, error) {
	if claims == nil {
		return nil, errors.New("notify: NewSender: effects client is nil")
	}
	if db == nil {
		return nil, errors.New("notify: NewSender: db is nil")
	}
	if opts == nil {
		opts = &SenderOpts{}
	}
	if strings.TrimSpace(opts.APIKey) == "" {
		return nil, errors.New("notify: NewSender: API key is required")
	}
	if opts.From == "" {
		return nil, errors.New("notify: NewSender: From address is required")
	}
	from, err := mail.ParseAddress(opts.From)
	if err != nil {
		return nil, fmt.Errorf("notify: NewSender: From %q is not an email address: %w", opts.From, err)
	}
	base := opts.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("notify: NewSender: BaseURL %q is not an http(s) URL", base)
	}
	window := opts.CollapseWindow
	switch {
	case window == 0:
		window = DefaultCollapseWindow
	case window < 0:
		return nil, fmt.Errorf("notify: NewSender: collapse window %s is negative", window)
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: DefaultTimeout}
	}
	sendTimeout := cmp.Or(hc.Timeout, DefaultTimeout)
	lk, err := newLookupOpts(opts, window, sendTimeout)
	if err != nil {
		return nil, err
	}
	policies := make(map[string]Policy, len(opts.Policies))
	for tmpl, p := range opts.Policies {
		if !p.Valid() {
			return nil, fmt.Errorf("notify: NewSender: template %q: unknown policy %q (want %q or %q)", tmpl, p, AtMostOnce, AtLeastOnce)
		}
		policies[tmpl] = p
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &Sender{
		claims: claims, db: db, apiKey: opts.APIKey, baseURL: strings.TrimRight(base, "/"),
		from: sgmail.NewEmail(from.Name, from.Address), window: window, policies: policies,
		http: &rest.Client{HTTPClient: hc}, logger: logger, lookup: lk, sendTimeout: sendTimeout,
	}, nil
}

// Policy returns the policy for template: the configured one, or AtMostOnce.
func (s *Sender) Policy(template string) Policy {
	if p, ok := s.policies[template]; ok {
		return p
	}
	return AtMostOnce
}

// Message is one email to send as a keyed effect.
type Message struct {
	// Template names the message type, such as "receipt". It picks the
	// policy, is the effect kind, and is part of the collapse window.
	Template string
	// To is the recipient address.
	To string
	// Subject and Text are the subject and the plain-text body. Neither is
	// stored nor logged.
	Subject, Text string
	// Key is the effect key, derived from the business event.
	Key effects.Key
	// Entity is what the message is about, such as an order ID. It is part
	// of the collapse window.
	Entity string
	// Owner is the claim owner: the logical step sending, such as the
	// workflow ID and step name.
	Owner string
	// Heartbeat, if set, is called after each renewal of the claim's lease
	// while the send runs, for example to record a Temporal heartbeat.
	Heartbeat func(ctx context.Context)
	// HeartbeatEvery is how often the lease is renewed (and Heartbeat
	// called). Zero means a third of the lease.
	HeartbeatEvery time.Duration
	// LookUpFirst makes a new claim look the key up at SendGrid before
	// sending, as a re-entered one always does. Set it when the effect
	// record may have been pruned, such as for an entity last changed longer
	// ago than the effect retention's floor: a new claim then does not prove
	// that nothing was sent.
	LookUpFirst bool
	// NotBefore, if set, is when the entity the key derives from was
	// created, as the database stored it: the claim looks for the key in
	// fewer leaves (effects.ClaimParams.NotBefore). Zero means unknown.
	NotBefore time.Time
	// Repeat says the send is being run again (a later attempt): its claim
	// goes straight to the claim function (effects.ClaimParams.Repeat).
	Repeat bool
}

func (m Message) validate() error {
	bad := func(field, reason string) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidMessage, field, reason)
	}
	switch {
	case m.Template == "":
		return bad("template", "empty")
	case len(m.Template) > 100:
		return bad("template", "longer than 100 bytes")
	case m.Key.IsZero():
		return bad("key", "empty")
	case m.Owner == "":
		return bad("owner", "empty")
	case m.Entity == "":
		return bad("entity", "empty")
	case m.Subject == "":
		return bad("subject", "empty")
	case m.Text == "":
		return bad("text", "empty")
	}
	if a, err := mail.ParseAddress(m.To); err != nil || a.Address != m.To {
		return bad("to", "not a plain email address")
	}
	return nil
}

// Result is the stored outcome of a send.
type Result struct {
	// MessageID is SendGrid's X-Message-Id; empty when Collapsed.
	MessageID string `json:"message_id,omitempty"`
	// Collapsed is true when the collapse window dropped the send as a
	// repeat of a recent one.
	Collapsed bool `json:"collapsed,omitempty"`
}

// Send sends m once per effect key, under the template's policy and the
// collapse window, and returns its outcome; a finished key returns the stored
// one without sending. An attempt finding an earlier unfinished claim first
// looks the key up at SendGrid and completes with the message found there.
// Errors: ErrInvalidMessage; transient *SendError wrapping ErrUnconfirmed (the
// request may have been written) or ErrUnavailable (429, 5xx, unreachable);
// *SendError wrapping ErrRejected (other 4xx); transient *LookupError wrapping
// ErrLookupPending or ErrLookupFailed; *LookupError wrapping
// effects.ErrAmbiguous once the look-up failed past LookupLag+LookupGiveUp;
// and effects.Do's errors as they are.
func (s *Sender) Send(ctx context.Context, m Message) (Result, error) {
	if err := m.validate(); err != nil {
		return Result{}, err
	}
	policy := s.Policy(m.Template)
	tracing.SetEffectKey(ctx, m.Key.String())
	rcpt := recipientDigest(m.Key.Tenant(), m.To)
	p := effects.ClaimParams{Key: m.Key, Kind: m.Template, Owner: m.Owner, Fingerprint: fingerprint(m.Template, rcpt, m.Entity),
		NotBefore: m.NotBefore, Repeat: m.Repeat}
	opts := &effects.DoOpts{Heartbeat: m.Heartbeat, ExtendEvery: m.HeartbeatEvery}
	res, err := effects.Do(ctx, s.claims, p, func(ctx context.Context, claim *effects.Claim) (Result, error) {
		log := s.logger.With("effect_key", m.Key.String(), "template", m.Template, "policy", string(policy))
		if claim.Mode != effects.ModeNew || m.LookUpFirst {
			res, done, err := s.settle(ctx, m, policy, rcpt, claim.Resolved, log)
			if err != nil || done {
				return res, err
			}
		}
		return s.send(ctx, m, rcpt, log)
	}, opts)
	if err != nil {
		return Result{}, fmt.Errorf("send %s %s: %w", m.Template, m.Key, err)
	}
	return res, nil
}

// send runs inside the claim: collapse window first, then SendGrid.
func (s *Sender) send(ctx context.Context, m Message, rcpt []byte, log *slog.Logger) (Result, error) {
	sentAt, open, err := s.openWindow(ctx, m, rcpt)
	if err != nil {
		// Nothing went out; another attempt may send.
		return Result{}, effects.Transient(err)
	}
	if !open {
		log.InfoContext(ctx, "send collapsed into a recent one", "window", s.window.String())
		return Result{Collapsed: true}, nil
	}
	id, err := s.post(ctx, m)
	if err != nil {
		if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRejected) {
			// Known not sent: give the window back so that a later send of
			// another key is not dropped for a message nobody received.
			// After ErrUnconfirmed the row stays: it may have gone out, and
			// the row's sent_at is when, for the retry's look-up.
			if cerr := s.closeWindow(context.WithoutCancel(ctx), m, rcpt, sentAt); cerr != nil {
				log.WarnContext(ctx, "release collapse window", "error", cerr)
			}
		}
		log.WarnContext(ctx, "send failed", "error", err)
		return Result{}, err
	}
	log.InfoContext(ctx, "email sent", "message_id", id)
	return Result{MessageID: id}, nil
}

// openWindowSQL is the collapse check in one statement: it inserts the row,
// or takes it over if the last send is older than the window or was this same
// effect (a retry is not a repeat). No row back means a recent send of
// another effect holds the window.
const openWindowSQL = `
INSERT INTO keyed_sends AS s (tenant_id, recipient_sha256, template, entity, effect_key, sent_at)
VALUES ($1, $2, $3, $4, $5, now())
ON CONFLICT (tenant_id, recipient_sha256, template, entity) DO UPDATE
SET sent_at = now(), effect_key = EXCLUDED.effect_key
WHERE s.sent_at < now() - $6 * interval '1 microsecond' OR s.effect_key = EXCLUDED.effect_key
RETURNING sent_at`

func (s *Sender) openWindow(ctx context.Context, m Message, rcpt []byte) (time.Time, bool, error) {
	var sentAt time.Time
	err := s.db.QueryRow(ctx, openWindowSQL, m.Key.Tenant(), rcpt, m.Template, m.Entity, m.Key.String(), s.window.Microseconds()).Scan(&sentAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("open collapse window: %w", err)
	}
	return sentAt, true, nil
}

func (s *Sender) closeWindow(ctx context.Context, m Message, rcpt []byte, sentAt time.Time) error {
	_, err := s.db.Exec(ctx, `
DELETE FROM keyed_sends
WHERE tenant_id = $1 AND recipient_sha256 = $2 AND template = $3 AND entity = $4 AND effect_key = $5 AND sent_at = $6`,
		m.Key.Tenant(), rcpt, m.Template, m.Entity, m.Key.String(), sentAt)
	return err
}

// Prune deletes collapse-window rows older than both the window and the
// send timeout plus LookupLag+LookupGiveUp, which no longer affect any send
// or look-up, and returns how many it deleted.
func (s *Sender) Prune(ctx context.Context) (int64, error) {
	keep := max(s.window, s.lookup.lag+s.lookup.giveUp) // lag includes the send timeout.
	tag, err := s.db.Exec(ctx, `DELETE FROM keyed_sends WHERE sent_at < now() - $1 * interval '1 microsecond'`, keep.Microseconds())
	if err != nil {
		return 0, fmt.Errorf("prune sends: %w", err)
	}
	return tag.RowsAffected(), nil
}

// post makes one mail send request. It never retries: Temporal (or the
// caller) retries, through the effect claim.
func (s *Sender) post(ctx context.Context, m Message) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.sendTimeout)
	defer cancel()
	msg := sgmail.NewV3MailInit(s.from, m.Subject, sgmail.NewEmail("", m.To), sgmail.NewContent("text/plain", m.Text))
	msg.SetCustomArg(CustomArgEffectKey, m.Key.String())
	msg.SetHeader(HeaderEffectKey, m.Key.String())

	req := sendgrid.GetRequest(s.apiKey, sendPath, s.baseURL)
	req.Method = rest.Post
	req.Body = sgmail.GetRequestBody(msg)
	// This is sendgrid.MakeRequestWithContext with our own *http.Client:
	// one request, no retry (unlike MakeRequestRetryWithContext).
	resp, err := s.http.SendWithContext(ctx, req)
	if err != nil {
		return "", transportError(err)
	}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return http.Header(resp.Headers).Get("X-Message-Id"), nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return "", effects.Transient(&SendError{Status: resp.StatusCode, Reason: reason(resp.Body), code: CodeUnavailable, kind: ErrUnavailable})
	default:
		return "", &SendError{Status: resp.StatusCode, Reason: reason(resp.Body), code: CodeRejected, kind: ErrRejected}
	}
}

// transportError classifies a failed request. A failure to connect means
// nothing was sent: ErrUnavailable. Anything later (a timeout, a reset, a
// dropped response) may have been accepted: ErrUnconfirmed. Both are
// transient; the retry of an unconfirmed send looks the key up first.
func transportError(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return effects.Transient(&SendError{Reason: "connect: " + op.Err.Error(), code: CodeUnavailable, kind: ErrUnavailable})
	}
	reason := withoutURL(err)
	return effects.Transient(&SendError{Reason: reason + "; the email may have been sent, so the retry looks it up at SendGrid first",
		code: CodeUnconfirmed, kind: ErrUnconfirmed})
}

// withoutURL returns err's message without the request URL.
func withoutURL(err error) string {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err.Error()
	}
	return err.Error()
}

// reason extracts SendGrid's first error message from body, shortened.
func reason(body string) string {
	var e struct {
		Errors []struct {
			Message string  `json:"message"`
			Field   *string `json:"field"`
		} `json:"errors"`
	}
	out := "no error message"
	if json.Unmarshal([]byte(body), &e) == nil && len(e.Errors) > 0 {
		out = e.Errors[0].Message
		if f := e.Errors[0].Field; f != nil && *f != "" {
			out = *f + ": " + out
		}
	}
	if len(out) > 200 {
		out = out[:200]
	}
	return out
}

// recipientDigest is the SHA-256 of the tenant and the lower-cased address,
// which recognises a recipient in the collapse window without storing it.
func recipientDigest(tenant, addr string) []byte {
	h := sha256.Sum256([]byte(tenant + "\x00" + strings.ToLower(strings.TrimSpace(addr))))
	return h[:]
}

// fingerprint identifies what a send is for, so that one effect key cannot
// be reused for another recipient, template or entity.
func fingerprint(template string, rcpt []byte, entity string) string {
	h := sha256.Sum256([]byte(template + "\x00" + hex.EncodeToString(rcpt) + "\x00" + entity))
	return "sha256:" + hex.EncodeToString(h[:16])
}
