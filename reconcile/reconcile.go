package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v76"
	stripeclient "github.com/stripe/stripe-go/v76/client"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// DefaultPageSize is how many PaymentIntents one search request asks for;
// 100 is Stripe's maximum.
const DefaultPageSize = 100

// ErrInvalidWindow is wrapped by the error Run returns for a window whose
// From or To is zero or whose To is not after From.
var ErrInvalidWindow = errors.New("invalid reconciliation window")

// Kind is the kind of a finding.
type Kind string

// The kinds of finding, from the most to the least urgent.
const (
	// KindExtraCharges: more than one succeeded PaymentIntent carries one
	// effect key. The customer was charged more than once for one effect.
	KindExtraCharges Kind = "extra_charges"
	// KindMissingRecord: Stripe has a succeeded PaymentIntent for an effect
	// key that has no succeeded record. Money was taken that keyed does not
	// know about.
	KindMissingRecord Kind = "missing_record"
	// KindMismatch: the succeeded record's stored payment intent, amount,
	// currency or status differs from Stripe's succeeded PaymentIntent for
	// the key.
	KindMismatch Kind = "mismatch"
	// KindMissingAtProvider: a succeeded record whose PaymentIntent Stripe
	// does not have, or has but not succeeded. keyed believes money was
	// taken that was not.
	KindMissingAtProvider Kind = "missing_at_provider"
)

// Kinds lists every kind of finding: the charge kinds, most urgent first,
// then the refund kinds (see KindDoubleRefund), most urgent first.
var Kinds = []Kind{KindExtraCharges, KindMissingRecord, KindMismatch, KindMissingAtProvider,
	KindDoubleRefund, KindReleasedButRefunded, KindUnrecordedRefund, KindRefundMismatch, KindRefundMissingAtProvider,
	KindDuplicateEmails, KindUnrecordedEmail, KindEmailMissingAtProvider}

// Window is the span of creation times reconciled: from From, inclusive, to
// To, exclusive. Both a record's created_at and a PaymentIntent's created
// are compared with it.
type Window struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

// Validate returns an error wrapping ErrInvalidWindow when From or To is
// zero or To is not after From.
func (w Window) Validate() error {
	switch {
	case w.From.IsZero() || w.To.IsZero():
		return fmt.Errorf("%w: from and to are both required", ErrInvalidWindow)
	case !w.To.After(w.From):
		return fmt.Errorf("%w: to %s is not after from %s", ErrInvalidWindow,
			w.To.UTC().Format(time.RFC3339), w.From.UTC().Format(time.RFC3339))
	}
	return nil
}

// Finding is one disagreement between keyed's records and Stripe. It holds
// outcomes only: IDs, statuses and amounts, never card data, emails,
// client secrets or refund reasons. A charge finding fills Record and
// Provider; a refund finding fills Refund and ProviderRefunds.
type Finding struct {
	Kind      Kind   `json:"kind"`
	TenantID  string `json:"tenant_id"`
	EffectKey string `json:"effect_key"`
	// RecordState is the state of keyed's effect record for the key (for a
	// refund, its refund_stripe step's), or empty when there is none.
	RecordState effects.State `json:"record_state,omitempty"`
	// Record is the outcome stored in a succeeded record, if any.
	Record *orders.ChargeResult `json:"record,omitempty"`
	// Provider holds the PaymentIntents Stripe created in the window under
	// the key (succeeded or not), in creation order, plus the record's own
	// PaymentIntent when Stripe has it, wherever it was created and
	// whichever key it carries.
	Provider []orders.ChargeResult `json:"provider,omitempty"`
	// Refund is the refund's ledger row and recorded Stripe outcome, or nil
	// when the ledger has no row for the key.
	Refund *RefundRecord `json:"refund,omitempty"`
	// ProviderRefunds holds Stripe's refunds carrying the key (failed and
	// canceled ones included), oldest first.
	ProviderRefunds []refunds.StripeResult `json:"provider_refunds,omitempty"`
	// Detail says what disagrees, in one sentence.
	Detail string `json:"detail"`
}

// Report is the result of one Run.
type Report struct {
	Window Window `json:"window"`
	// Records is the number of charge records created in the window.
	Records int `json:"records"`
	// PaymentIntents is the number of PaymentIntents carrying an effect key
	// that Stripe created in the window.
	PaymentIntents int `json:"payment_intents"`
	// Refunds is the number of refunds reserved in refund_ledger in the
	// window.
	Refunds int `json:"refunds"`
	// StripeRefunds is the number of refunds carrying an effect key that
	// Stripe created in the window.
	StripeRefunds int `json:"stripe_refunds"`
	// Emails is the number of receipt and refund email records created in
	// the window whose keys were looked up at SendGrid.
	Emails int `json:"emails,omitempty"`
	// InFlight is the number of effect keys skipped because their claim
	// holds a live lease, or, for a refund, because it was reserved less
	// than Opts.RefundGrace ago and has not recorded Stripe's answer: the
	// charge or refund is still running, and its record may not be
	// complete yet. The next run whose window covers them checks them.
	InFlight int `json:"in_flight"`
	// Findings lists every disagreement, by tenant, effect key and kind.
	Findings []Finding `json:"findings"`
}

// Clean reports whether the run found no disagreement.
func (r *Report) Clean() bool { return len(r.Findings) == 0 }

// Counts returns the number of findings of each kind, every kind included.
func (r *Report) Counts() map[Kind]int {
	out := make(map[Kind]int, len(Kinds))
	for _, k := range Kinds {
		out[k] = 0
	}
	for _, f := range r.Findings {
		out[f.Kind]++
	}
	return out
}

// Opts configures a Reconciler. A nil *Opts means all defaults.
type Opts struct {
	// Registerer, if set, receives the reconciler's collectors: findings
	// by kind in the last run (a gauge), findings by kind ever (a counter)
	// and the time of the last successful run.
	Registerer prometheus.Registerer
	// Logger receives one record per finding and one per run. Nil means
	// slog.Default().
	Logger *slog.Logger
	// PageSize is how many PaymentIntents each search request asks for,
	// 1 to 100. Zero means DefaultPageSize.
	PageSize int
	// Sender, if set, looks up every receipt and refund email record's key
	// at SendGrid's Email Activity (KindDuplicateEmails,
	// KindUnrecordedEmail, KindEmailMissingAtProvider).
	Sender *notify.Sender
	// RefundGrace is how long after its reservation a refund may be without
	// a Stripe refund or a recorded answer before it is reported. Zero means
	// DefaultRefundGrace.
	RefundGrace time.Duration
}

// Reconciler compares keyed's charge records with Stripe's PaymentIntents,
// and its refund ledger with Stripe's refunds.
// It only reads, on both sides, so any number of runs, overlapping or
// concurrent, are harmless. It is safe for concurrent use.
type Reconciler struct {
	claims   *effects.Client
	db       effects.DB
	stripe   *stripeclient.API
	logger   *slog.Logger
	pageSize int64
	// refundGrace is Opts.RefundGrace or its default.
	refundGrace time.Duration
	metrics     *metrics
	sender      *notify.Sender
}

// New returns a Reconciler reading effect records through claims, the
// database clock and refund ledger through db, and Stripe through stripe (a
// stripestep.NewClient). It returns an error for a nil claims, db or stripe
// (or one without PaymentIntents or Refunds), a page size outside 1 to 100, a
// negative refund grace, or collectors already registered.
func New(claims *effects.Client, db effects.DB, stripe *stripeclient.API, opts *Opts) (*Reconciler, error) {
	switch {
	case claims == nil:
		return nil, errors.New("reconcile: New: effects client is nil")
	case db == nil:
		return nil, errors.New("reconcile: New: db is nil")
	case stripe == nil || stripe.PaymentIntents == nil || stripe.Refunds == nil:
		return nil, errors.New("reconcile: New: Stripe client is nil")
	}
	if opts == nil {
		opts = &Opts{}
	}
	r := &Reconciler{claims: claims, db: db, stripe: stripe, logger: opts.Logger, pageSize: int64(opts.PageSize),
		refundGrace: cmp.Or(opts.RefundGrace, DefaultRefundGrace), sender: opts.Sender}
	if opts.RefundGrace < 0 {
		return nil, fmt.Errorf("reconcile: New: refund grace %s is negative", opts.RefundGrace)
	}
	switch {
	case r.pageSize == 0:
		r.pageSize = DefaultPageSize
	case r.pageSize < 1 || r.pageSize > 100:
		return nil, fmt.Errorf("reconcile: New: page size %d is not between 1 and 100", opts.PageSize)
	}
	if r.logger == nil {
		r.logger = slog.Default()
	}
	if opts.Registerer != nil {
		m, err := newMetrics(opts.Registerer)
		if err != nil {
			return nil, fmt.Errorf("reconcile: New: %w", err)
		}
		r.metrics = m
	}
	return r, nil
}

// Run compares the charge records and refund_ledger rows created in w with the
// PaymentIntents and refunds carrying an effect key that Stripe created in w,
// and returns every disagreement; a side that falls outside w is looked up by
// ID or key, so nothing straddling a boundary reads as missing. It returns an
// error wrapping ErrInvalidWindow for a bad window and a wrapped Postgres or
// Stripe error, never a partial report. A successful run is recorded (see
// Last); failing to record it is only logged.
func (r *Reconciler) Run(ctx context.Context, w Window) (*Report, error) {
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	var dbNow time.Time
	if err := r.db.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		return nil, fmt.Errorf("reconcile: read database clock: %w", err)
	}
	recs, err := r.claims.ListKind(ctx, orders.StepCharge, w.From, w.To)
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	pis, n, err := r.search(ctx, w)
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	rep := &Report{Window: w, Records: len(recs), PaymentIntents: n, Findings: []Finding{}}

	byKey := make(map[string]*effects.Record, len(recs))
	keys := make([]string, 0, len(recs)+len(pis))
	for _, rec := range recs {
		byKey[rec.Key] = rec
		keys = append(keys, rec.Key)
	}
	for key := range pis {
		if _, ok := byKey[key]; ok {
			continue
		}
		// Claimed before the window, charged in it: read the record itself.
		rec, err := r.record(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
		byKey[key] = rec
		keys = append(keys, key)
	}
	slices.Sort(keys)
	for _, key := range keys {
		found, inFlight, err := r.check(ctx, key, byKey[key], pis[key], dbNow)
		if err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
		if inFlight {
			rep.InFlight++
		}
		rep.Findings = append(rep.Findings, found...)
	}
	if err := r.refundPass(ctx, w, dbNow, pis, rep); err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	if err := r.emailPass(ctx, w, rep); err != nil {
		return nil, fmt.Errorf("reconcile: emails: %w", err)
	}
	slices.SortStableFunc(rep.Findings, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.TenantID, b.TenantID), cmp.Compare(a.EffectKey, b.EffectKey),
			cmp.Compare(slices.Index(Kinds, a.Kind), slices.Index(Kinds, b.Kind)))
	})

	for _, f := range rep.Findings {
		r.logger.LogAttrs(ctx, slog.LevelWarn, "reconciliation finding",
			slog.String("kind", string(f.Kind)), slog.String("tenant_id", f.TenantID),
			slog.String("effect_key", f.EffectKey), slog.String("detail", f.Detail))
	}
	r.logger.LogAttrs(ctx, slog.LevelInfo, "reconciled charges and refunds with Stripe",
		slog.Time("from", w.From), slog.Time("to", w.To), slog.Int("records", rep.Records),
		slog.Int("payment_intents", rep.PaymentIntents), slog.Int("refunds", rep.Refunds),
		slog.Int("stripe_refunds", rep.StripeRefunds), slog.Int("in_flight", rep.InFlight),
		slog.Int("findings", len(rep.Findings)))
	r.metrics.observe(rep)
	if err := record(ctx, r.db, rep); err != nil {
		// The report stands; only doctor's "reconcile ran" check misses it.
		r.logger.LogAttrs(ctx, slog.LevelError, "reconciled, but could not record the run", slog.String("err", err.Error()))
	}
	return rep, nil
}

// search returns the PaymentIntents carrying an effect key that Stripe
// created in w, by effect key, and how many there are.
func (r *Reconciler) search(ctx context.Context, w Window) (map[string][]*stripe.PaymentIntent, int, error) {
	// created is whole seconds: c >= From exactly when c >= ceil(From), and
	// c < To exactly when c < ceil(To).
	query := "created>=" + strconv.FormatInt(ceilUnix(w.From), 10) + " AND created<" + strconv.FormatInt(ceilUnix(w.To), 10)
	params := &stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{
		Context: ctx, Query: query, Limit: stripe.Int64(r.pageSize)}}
	out := map[string][]*stripe.PaymentIntent{}
	seen := map[string]bool{}
	it := r.stripe.PaymentIntents.Search(params)
	for it.Next() {
		pi := it.PaymentIntent()
		key := pi.Metadata[stripestep.MetadataEffectKey]
		if key == "" || seen[pi.ID] {
			continue // not keyed's, or repeated across pages
		}
		seen[pi.ID] = true
		out[key] = append(out[key], pi)
	}
	if err := it.Err(); err != nil {
		return nil, 0, fmt.Errorf("search Stripe payment intents: %w", err)
	}
	return out, len(seen), nil
}

// record returns keyed's record for key, or nil when there is none or key
// is not a valid effect key.
func (r *Reconciler) record(ctx context.Context, key string) (*effects.Record, error) {
	k, err := effects.ParseKey(key)
	if err != nil {
		return nil, nil
	}
	rec, err := r.claims.Get(ctx, k)
	if errors.Is(err, effects.ErrNotFound) {
		return nil, nil
	}
	return rec, err
}

// paymentIntent returns the PaymentIntent id, or nil when Stripe has none.
func (r *Reconciler) paymentIntent(ctx context.Context, id string) (*stripe.PaymentIntent, error) {
	pi, err := r.stripe.PaymentIntents.Get(id, &stripe.PaymentIntentParams{Params: stripe.Params{Context: ctx}})
	var se *stripe.Error
	if errors.As(err, &se) && (se.HTTPStatusCode == http.StatusNotFound || se.Code == stripe.ErrorCodeResourceMissing) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get Stripe payment intent %s: %w", id, err)
	}
	return pi, nil
}

// check compares one effect key's record, nil when keyed has none, with
// the PaymentIntents Stripe created in the window under that key. It
// reports inFlight, and no findings, for a claim with a live lease.
func (r *Reconciler) check(ctx context.Context, key string, rec *effects.Record, pis []*stripe.PaymentIntent,
	dbNow time.Time) (found []Finding, inFlight bool, err error) {
	if rec != nil && rec.State == effects.StateClaimed && rec.LeaseUntil != nil && rec.LeaseUntil.After(dbNow) {
		return nil, true, nil
	}
	var stored *orders.ChargeResult
	unreadable := false
	if rec != nil && rec.State == effects.StateSucceeded {
		var res orders.ChargeResult
		cl := effects.Claim{Result: rec.Result}
		if err := cl.Decode(&res); err != nil || res.PaymentIntentID == "" {
			unreadable = true
		} else {
			stored = &res
		}
	}

	// The record's PaymentIntent may be outside the window, not searchable
	// yet, or under another key: fetch it by ID.
	var foreign *stripe.PaymentIntent
	if stored != nil && indexOf(pis, stored.PaymentIntentID) < 0 {
		pi, err := r.paymentIntent(ctx, stored.PaymentIntentID)
		if err != nil {
			return nil, false, err
		}
		switch {
		case pi == nil:
		case pi.Metadata[stripestep.MetadataEffectKey] == key:
			pis = append(slices.Clone(pis), pi)
			slices.SortStableFunc(pis, func(a, b *stripe.PaymentIntent) int { return cmp.Compare(a.Created, b.Created) })
		default:
			foreign = pi
		}
	}

	base := Finding{EffectKey: key, TenantID: tenantOf(key, rec, pis), Record: stored, Provider: outcomes(pis)}
	if rec != nil {
		base.RecordState = rec.State
	}
	if foreign != nil {
		base.Provider = append(base.Provider, stripestep.ChargeResult(foreign))
	}
	add := func(kind Kind, format string, args ...any) {
		f := base
		f.Kind, f.Detail = kind, fmt.Sprintf(format, args...)
		found = append(found, f)
	}
	var succeeded []*stripe.PaymentIntent
	for _, pi := range pis {
		if pi.Status == stripe.PaymentIntentStatusSucceeded {
			succeeded = append(succeeded, pi)
		}
	}

	if len(succeeded) > 1 {
		add(KindExtraCharges, "%d succeeded payment intents carry this effect key: %s", len(succeeded), ids(succeeded))
	}
	switch {
	case unreadable:
		add(KindMismatch, "the succeeded record stores no readable payment intent ID")
	case stored == nil:
		if len(succeeded) > 0 {
			has := "no record"
			if rec != nil {
				has = "only a record in state " + string(rec.State)
			}
			add(KindMissingRecord, "Stripe charged %s under this key, and keyed has %s", ids(succeeded), has)
		}
	case len(succeeded) == 0:
		switch i := indexOf(pis, stored.PaymentIntentID); {
		case foreign != nil:
			add(KindMismatch, "the stored payment intent %s carries effect key %q at Stripe, not this one",
				foreign.ID, foreign.Metadata[stripestep.MetadataEffectKey])
		case i >= 0:
			add(KindMissingAtProvider, "the stored payment intent %s is %s at Stripe, not succeeded", stored.PaymentIntentID, pis[i].Status)
		default:
			add(KindMissingAtProvider, "the stored payment intent %s does not exist at Stripe", stored.PaymentIntentID)
		}
	default:
		i := indexOf(succeeded, stored.PaymentIntentID)
		if i < 0 {
			add(KindMismatch, "the record stores payment intent %s, but Stripe's succeeded charge under this key is %s",
				stored.PaymentIntentID, ids(succeeded))
		} else if diff := differences(stored, succeeded[i]); diff != "" {
			add(KindMismatch, "the record and Stripe disagree on payment intent %s: %s", stored.PaymentIntentID, diff)
		}
	}
	return found, false, nil
}

func indexOf(pis []*stripe.PaymentIntent, id string) int {
	return slices.IndexFunc(pis, func(pi *stripe.PaymentIntent) bool { return pi.ID == id })
}

// differences describes how stored differs from pi, or returns "".
func differences(stored *orders.ChargeResult, pi *stripe.PaymentIntent) string {
	var d []string
	if stored.AmountMinor != pi.Amount || !strings.EqualFold(stored.Currency, string(pi.Currency)) {
		d = append(d, fmt.Sprintf("amount %d %s stored, %d %s at Stripe",
			stored.AmountMinor, stored.Currency, pi.Amount, pi.Currency))
	}
	if stored.Status != string(pi.Status) {
		d = append(d, fmt.Sprintf("status %s stored, %s at Stripe", stored.Status, pi.Status))
	}
	return strings.Join(d, "; ")
}

// tenantOf returns the tenant of key: the record's, else the key's own,
// else the PaymentIntents' tenant_id metadata.
func tenantOf(key string, rec *effects.Record, pis []*stripe.PaymentIntent) string {
	if rec != nil {
		return rec.TenantID
	}
	if k, err := effects.ParseKey(key); err == nil {
		return k.Tenant()
	}
	for _, pi := range pis {
		if t := pi.Metadata[stripestep.MetadataTenantID]; t != "" {
			return t
		}
	}
	return ""
}

func outcomes(pis []*stripe.PaymentIntent) []orders.ChargeResult {
	if len(pis) == 0 {
		return nil
	}
	out := make([]orders.ChargeResult, len(pis))
	for i, pi := range pis {
		out[i] = stripestep.ChargeResult(pi)
	}
	return out
}

func ids(pis []*stripe.PaymentIntent) string {
	s := make([]string, len(pis))
	for i, pi := range pis {
		s[i] = pi.ID
	}
	return strings.Join(s, ", ")
}

// ceilUnix returns t in whole Unix seconds, rounded up.
func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}
