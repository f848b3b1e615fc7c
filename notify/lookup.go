package notify

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sendgrid/rest"
	"github.com/sendgrid/sendgrid-go"

	"github.com/keyedhq/keyed/effects"
)

// activityPath is SendGrid's Email Activity API, "Filter all messages".
const activityPath = "/v3/messages"

// lookupOpts is the validated look-up configuration of a Sender. lag
// includes the send timeout: it counts from the start of the POST.
type lookupOpts struct {
	lag, timeout, giveUp time.Duration
}

func newLookupOpts(opts *SenderOpts, window, sendTimeout time.Duration) (lookupOpts, error) {
	o := lookupOpts{lag: opts.LookupLag, timeout: opts.LookupTimeout, giveUp: opts.LookupGiveUp}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"LookupLag", o.lag}, {"LookupTimeout", o.timeout}, {"LookupGiveUp", o.giveUp}} {
		if d.d < 0 {
			return o, fmt.Errorf("notify: NewSender: %s %s is negative", d.name, d.d)
		}
	}
	o.lag = cmp.Or(o.lag, DefaultLookupLag)
	o.timeout = cmp.Or(o.timeout, DefaultLookupTimeout)
	o.giveUp = cmp.Or(o.giveUp, DefaultLookupGiveUp)
	if sendTimeout+o.lag > window {
		return o, fmt.Errorf("notify: NewSender: send timeout %s plus LookupLag %s exceeds the collapse window %s: the window's row, which dates a possible send, must outlive the request and SendGrid's indexing lag",
			sendTimeout, o.lag, window)
	}
	o.lag += sendTimeout
	return o, nil
}

// settle runs when an attempt finds an earlier unfinished claim, before it may
// send. It returns done with the result when SendGrid shows a message under
// the key; done false and no error when sending is safe under policy, or an
// operator resolved the key to retry (resolved: they checked, and SendGrid's
// look-up, failing or lagging, does not overrule them); else the error to
// record (a transient *LookupError, or an ambiguous one at most once).
func (s *Sender) settle(ctx context.Context, m Message, policy Policy, rcpt []byte, resolved bool, log *slog.Logger) (Result, bool, error) {
	id, lerr := s.find(ctx, m.Key)
	if lerr == nil && id != "" {
		log.InfoContext(ctx, "email found at SendGrid under the effect key; not sending again", "message_id", id)
		return Result{MessageID: id}, true, nil
	}
	if resolved {
		log.WarnContext(ctx, "an operator resolved the email as not sent; sending", "lookup_failed", lerr != nil)
		return Result{}, false, nil
	}
	since, posted, err := s.lastPost(ctx, m, rcpt)
	if err != nil {
		return Result{}, false, effects.Transient(err)
	}
	if !posted {
		if lerr == nil {
			return Result{}, false, nil // Never posted, or long enough ago that the index is complete.
		}
		// No row: the earlier attempt never reached the POST, unless the
		// row aged out of the window (pruned or taken over by another key).
		age, err := s.claimAge(ctx, m.Key)
		if err != nil {
			return Result{}, false, effects.Transient(err)
		}
		if age < s.window {
			log.InfoContext(ctx, "earlier attempt never posted; sending without the look-up", "lookup_error", lerr.Error())
			return Result{}, false, nil
		}
		since = age
	}
	le := &LookupError{Key: m.Key.String(), Since: since}
	if lerr == nil {
		if since < s.lookup.lag {
			le.code, le.kind, le.Wait = CodeLookupPending, ErrLookupPending, s.lookup.lag-since
			log.InfoContext(ctx, "waiting for SendGrid's activity index", "since_post", since.String(), "wait_until", s.lookup.lag.String())
			return Result{}, false, effects.Transient(le)
		}
		log.InfoContext(ctx, "no email under the effect key after the lag window; sending", "since", since.String())
		return Result{}, false, nil
	}
	var f *lookupFailure
	if errors.As(lerr, &f) {
		le.Status, le.Reason = f.status, f.reason
	}
	if bound := s.lookup.lag + s.lookup.giveUp; since < bound {
		le.code, le.kind, le.Wait = CodeLookupFailed, ErrLookupFailed, bound-since
		log.WarnContext(ctx, "email activity look-up failed; retrying", "error", lerr.Error(), "since", since.String())
		return Result{}, false, effects.Transient(le)
	}
	if policy == AtLeastOnce {
		log.WarnContext(ctx, "email activity look-up failed past the bound; sending again (at least once)", "error", lerr.Error())
		return Result{}, false, nil
	}
	le.code, le.kind = CodeAmbiguous, effects.ErrAmbiguous
	log.WarnContext(ctx, "email activity look-up failed past the bound; not sending (at most once)", "error", lerr.Error())
	return Result{}, false, le
}

// lastPostSQL returns how long ago this effect's collapse-window row was
// written, right before its latest POST, in microseconds.
const lastPostSQL = `
SELECT (extract(epoch FROM now() - sent_at) * 1000000)::bigint
FROM keyed_sends
WHERE tenant_id = $1 AND recipient_sha256 = $2 AND template = $3 AND entity = $4 AND effect_key = $5`

// lastPost reports how long ago an earlier attempt of m may have posted it,
// from the collapse-window row written right before each POST; posted is
// false when no row of this key exists.
func (s *Sender) lastPost(ctx context.Context, m Message, rcpt []byte) (time.Duration, bool, error) {
	var us int64
	err := s.db.QueryRow(ctx, lastPostSQL, m.Key.Tenant(), rcpt, m.Template, m.Entity, m.Key.String()).Scan(&us)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read collapse window: %w", err)
	}
	return max(time.Duration(us)*time.Microsecond, 0), true, nil
}

// claimAge returns how long ago key's effect record was first claimed.
func (s *Sender) claimAge(ctx context.Context, key effects.Key) (time.Duration, error) {
	rec, err := s.claims.Get(ctx, key)
	if err != nil {
		return 0, fmt.Errorf("read effect record: %w", err)
	}
	return time.Since(rec.CreatedAt), nil
}

// lookupFailure is a failed Email Activity request.
type lookupFailure struct {
	status int
	reason string
}

func (f *lookupFailure) Error() string {
	if f.status == 0 {
		return "email activity look-up: " + f.reason
	}
	return fmt.Sprintf("email activity look-up: status %d: %s", f.status, f.reason)
}

// ActivityQuery returns the Email Activity API query that finds the messages
// sent under key: its custom argument CustomArgEffectKey, which SendGrid's
// query language names unique_args.
func ActivityQuery(key effects.Key) string {
	v := strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key.String())
	return `(unique_args['` + CustomArgEffectKey + `']="` + v + `")`
}

// find asks SendGrid's Email Activity API for a message under key and
// returns its X-Message-Id, or "" when there is none. A failed request
// returns a *lookupFailure.
func (s *Sender) find(ctx context.Context, key effects.Key) (string, error) {
	ids, err := s.findAll(ctx, key)
	if err != nil || len(ids) == 0 {
		return "", err
	}
	return ids[0], nil
}

// findAll asks SendGrid's Email Activity API for the messages under key
// and returns their X-Message-Ids, most recent first, none when there are
// none. A failed request returns a *lookupFailure.
func (s *Sender) findAll(ctx context.Context, key effects.Key) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.lookup.timeout)
	defer cancel()
	req := sendgrid.GetRequest(s.apiKey, activityPath, s.baseURL)
	req.Method = rest.Get
	req.QueryParams = map[string]string{"query": ActivityQuery(key), "limit": "10"}
	resp, err := s.http.SendWithContext(ctx, req)
	if err != nil {
		return nil, &lookupFailure{reason: withoutURL(err)}
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &lookupFailure{status: resp.StatusCode, reason: reason(resp.Body)}
	}
	var body struct {
		Messages []struct {
			MsgID string `json:"msg_id"`
		} `json:"messages"`
	}
	if err := json.Unmarshal([]byte(resp.Body), &body); err != nil {
		return nil, &lookupFailure{status: resp.StatusCode, reason: "undecodable answer"}
	}
	var ids []string
	for _, msg := range body.Messages {
		if id := xMessageID(msg.MsgID); id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// ErrNotSent means SendGrid's Email Activity shows no message of the given
// ID under the effect key, and its index has had the lag window to show
// one: the message did not go out under that key. See Sender.Confirm.
var ErrNotSent = errors.New("SendGrid shows no such message under the effect key")

// Confirm asks SendGrid's Email Activity API whether messageID (X-Message-Id
// or msg_id) went out under key, for an operator's "done". It returns nil when
// SendGrid shows it; ErrNotSent, naming what SendGrid shows, when it does not
// and the record is older than the send timeout plus LookupLag;
// ErrLookupPending when the index may still lag; ErrLookupFailed when the
// look-up failed. Errors never hold the API key.
func (s *Sender) Confirm(ctx context.Context, key effects.Key, messageID string) error {
	ids, err := s.findAll(ctx, key)
	if err != nil {
		return lookupFailed(err)
	}
	if slices.Contains(ids, xMessageID(messageID)) { // The activity feed's msg_id names it too.
		return nil
	}
	shows := "no message"
	if len(ids) > 0 {
		shows = "only " + strings.Join(ids, ", ")
	}
	if err := s.pastLag(ctx, key, shows); err != nil {
		return err
	}
	return fmt.Errorf("%w: SendGrid's Email Activity shows %s under %s, not %s", ErrNotSent, shows, key, messageID)
}

// Find asks SendGrid's Email Activity API what went out under key, for a
// wait keyed settles without a person. It returns the X-Message-Id of the
// latest message; an error wrapping ErrNotSent when it shows none although
// the key's effect record last changed at least LookupLag (plus the send
// timeout) ago; one wrapping ErrLookupPending while the index may lag; and
// one wrapping ErrLookupFailed when the look-up fails. Errors never hold
// the API key.
func (s *Sender) Find(ctx context.Context, key effects.Key) (string, error) {
	ids, err := s.findAll(ctx, key)
	if err != nil {
		return "", lookupFailed(err)
	}
	if len(ids) > 0 {
		return ids[0], nil
	}
	if err := s.pastLag(ctx, key, "no message"); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%w: SendGrid's Email Activity shows no message under %s after its index lag", ErrNotSent, key)
}

// Lookup returns the X-Message-Ids SendGrid's Email Activity shows under
// key, most recent first, and whether its index has had the lag since
// key's record last changed (settled: what it shows is complete). A failed
// look-up returns an error wrapping ErrLookupFailed, never the API key.
func (s *Sender) Lookup(ctx context.Context, key effects.Key) (ids []string, settled bool, err error) {
	ids, err = s.findAll(ctx, key)
	if err != nil {
		return nil, false, lookupFailed(err)
	}
	since, err := s.sinceChange(ctx, key)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %w", ErrLookupFailed, err)
	}
	return ids, since >= s.lookup.lag, nil
}

// lookupFailed wraps a failed look-up in ErrLookupFailed, naming what a
// 401 or 403 needs.
func lookupFailed(err error) error {
	msg := err.Error()
	var f *lookupFailure
	if errors.As(err, &f) && (f.status == http.StatusUnauthorized || f.status == http.StatusForbidden) {
		msg += " (the API key needs the Email Activity scope, and the account the Email Activity add-on)"
	}
	return fmt.Errorf("%w: %s", ErrLookupFailed, msg)
}

// pastLag returns an error wrapping ErrLookupPending, saying that SendGrid
// shows what shows, while key's record changed less than the lag ago.
func (s *Sender) pastLag(ctx context.Context, key effects.Key, shows string) error {
	since, err := s.sinceChange(ctx, key)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrLookupFailed, err)
	}
	if since < s.lookup.lag {
		return fmt.Errorf("%w: SendGrid shows %s under %s so far; its index may take %s and the effect record changed %s ago: ask again in %s",
			ErrLookupPending, shows, key, s.lookup.lag, since.Round(time.Second), (s.lookup.lag - since).Round(time.Second))
	}
	return nil
}

// sinceChange returns how long ago key's effect record last changed, which
// is after any POST of its attempts; a key with no record is long settled.
func (s *Sender) sinceChange(ctx context.Context, key effects.Key) (time.Duration, error) {
	rec, err := s.claims.Get(ctx, key)
	if errors.Is(err, effects.ErrNotFound) {
		return s.lookup.lag, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read effect record: %w", err)
	}
	return time.Since(rec.UpdatedAt), nil
}

// xMessageID returns the X-Message-Id part of SendGrid's msg_id, which is
// the send request's X-Message-Id followed by ".filter…" (the per-recipient
// part), so that a settled send stores the same ID as a confirmed one. A
// msg_id of another shape is returned whole.
func xMessageID(msgID string) string {
	if i := strings.Index(msgID, ".filter"); i > 0 {
		return msgID[:i]
	}
	return msgID
}

// CheckLookup makes one Email Activity request for a key no message carries,
// so a worker can tell at start whether unfinished sends can be settled. It
// returns nil when SendGrid answers, else an error wrapping ErrLookupFailed
// naming the HTTP status (403: no scope or no add-on), never the API key.
func (s *Sender) CheckLookup(ctx context.Context) error {
	probe, err := effects.NewKey("keyed", "lookup-check")
	if err != nil {
		return fmt.Errorf("check email activity look-up: %w", err)
	}
	if _, err := s.find(ctx, probe); err != nil {
		return fmt.Errorf("check email activity look-up: %w: %w", ErrLookupFailed, err)
	}
	return nil
}
