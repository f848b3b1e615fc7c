package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// The kinds of refund finding, from the most to the least urgent. Their
// effect key is the refund's refund_stripe step key,
// "<tenant>:order:<order>:refund:<refund_id>:refund_stripe", which is also
// the Stripe refund's metadata effect_key.
const (
	// KindDoubleRefund: more than one Stripe refund that is not failed or
	// canceled carries one refund's effect key. The customer got the money
	// back more than once.
	KindDoubleRefund Kind = "double_refund"
	// KindUnrecordedRefund: Stripe refunded under an effect key that has no
	// row in refund_ledger, or whose refund_stripe step never recorded
	// Stripe's answer (and is neither running nor younger than
	// Opts.RefundGrace). Money went out without a record. A refund of a
	// keyed charge that carries no effect key at all (made from the
	// Dashboard or the API) is reported under the charge's effect key.
	KindUnrecordedRefund Kind = "unrecorded_refund"
	// KindRefundMismatch: the ledger row or the recorded Stripe outcome and
	// Stripe's refund differ in refund ID, amount, currency or payment
	// intent.
	KindRefundMismatch Kind = "refund_mismatch"
	// KindRefundMissingAtProvider: a refund in refund_ledger has no Stripe
	// refund (or only failed or canceled ones), although its refund_stripe
	// step recorded one, or it was reserved longer ago than
	// Opts.RefundGrace and is not running. keyed shows a refund the
	// customer did not get.
	KindRefundMissingAtProvider Kind = "refund_missing_at_provider"
	// KindReleasedButRefunded: keyed released a refund's reservation after
	// Stripe refused it (refund_releases), and yet Stripe has a refund that
	// is not failed or canceled under its key. keyed counts as left to
	// refund money the customer already got back.
	KindReleasedButRefunded Kind = "released_but_refunded"
)

// DefaultRefundGrace is how long after its ledger row a refund may still
// be without a Stripe refund, or without a recorded answer, before Run
// reports it: the refund workflow runs its Stripe step right after the
// reservation, and retries it for minutes at most.
const DefaultRefundGrace = time.Hour

// RefundRecord is keyed's side of one refund in a Finding: its ledger row
// and, once the refund_stripe step recorded it, Stripe's answer. It holds
// no reason text, which is the caller's free text.
type RefundRecord struct {
	OrderID     string `json:"order_id"`
	RefundID    string `json:"refund_id"`
	AmountMinor int64  `json:"amount_minor"`
	// Currency is the order's.
	Currency   string    `json:"currency"`
	ReservedAt time.Time `json:"reserved_at"`
	// Stripe is the outcome stored in refund_stripe_outcomes, or nil.
	Stripe *refunds.StripeResult `json:"stripe,omitempty"`
	// ReleasedAt and ReleaseCode are set when keyed released the refund's
	// reservation after Stripe refused it (refund_releases): when, and
	// Stripe's refusal code.
	ReleasedAt  *time.Time `json:"released_at,omitempty"`
	ReleaseCode string     `json:"release_code,omitempty"`
}

// refundSide is everything compared for one refund effect key.
type refundSide struct {
	key      string
	tenant   string
	row      *RefundRecord   // nil when the ledger has no row
	step     *effects.Record // the refund_stripe step's record, or nil
	chargePI string          // the order's charged payment intent, "" when unknown
	stripe   []*stripe.Refund
}

// refundPass compares the refunds reserved in w, and those Stripe made in
// w, with each other, and adds its counts and findings to rep. pis are the
// charge pass's PaymentIntents by charge effect key.
func (r *Reconciler) refundPass(ctx context.Context, w Window, dbNow time.Time, pis map[string][]*stripe.PaymentIntent, rep *Report) error {
	sides, err := r.ledgerSides(ctx, `l.created_at >= $1 AND l.created_at < $2`, w.From, w.To)
	if err != nil {
		return err
	}
	rep.Refunds = len(sides)
	made, outside, err := r.refundsMadeIn(ctx, w)
	if err != nil {
		return err
	}
	found, err := r.refundsOutsideKeyed(ctx, outside, pis)
	if err != nil {
		return err
	}
	rep.Findings = append(rep.Findings, found...)
	for key, res := range made {
		rep.StripeRefunds += len(res)
		if sides[key] == nil {
			if sides[key], err = r.sideOf(ctx, key, res); err != nil {
				return err
			}
		}
	}
	keys := slices.Sorted(maps.Keys(sides))
	listed := map[string][]*stripe.Refund{}
	for _, key := range keys {
		s := sides[key]
		if err := r.complete(ctx, s, made[key], pis, listed); err != nil {
			return err
		}
		found, inFlight := checkRefund(s, dbNow, r.refundGrace)
		if inFlight {
			rep.InFlight++
		}
		rep.Findings = append(rep.Findings, found...)
	}
	return nil
}

// ledgerSides returns the ledger rows matching where (on refund_ledger l),
// with their recorded Stripe outcomes, by refund_stripe effect key.
func (r *Reconciler) ledgerSides(ctx context.Context, where string, args ...any) (map[string]*refundSide, error) {
	rows, err := r.db.Query(ctx, `
SELECT l.tenant_id, l.order_id, l.refund_id, l.amount_minor, o.currency, l.created_at,
       s.stripe_refund_id, s.payment_intent_id, s.status, s.amount_minor, s.currency, r.created_at, r.code
FROM refund_ledger l
JOIN orders o ON o.tenant_id = l.tenant_id AND o.id = l.order_id
LEFT JOIN refund_stripe_outcomes s ON s.tenant_id = l.tenant_id AND s.order_id = l.order_id AND s.refund_id = l.refund_id
LEFT JOIN refund_releases r ON r.tenant_id = l.tenant_id AND r.order_id = l.order_id AND r.refund_id = l.refund_id
WHERE `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("read refund ledger: %w", err)
	}
	out := map[string]*refundSide{}
	var (
		tenant              string
		rec                 RefundRecord
		sid, spi, sst, scur *string
		samt                *int64
		relAt               *time.Time
		relCode             *string
	)
	_, err = pgx.ForEachRow(rows, []any{&tenant, &rec.OrderID, &rec.RefundID, &rec.AmountMinor, &rec.Currency, &rec.ReservedAt,
		&sid, &spi, &sst, &samt, &scur, &relAt, &relCode}, func() error {
		row := rec
		if relAt != nil {
			row.ReleasedAt, row.ReleaseCode = relAt, *relCode
		}
		if sid != nil {
			row.Stripe = &refunds.StripeResult{RefundID: *sid, PaymentIntentID: *spi, Status: *sst, AmountMinor: *samt, Currency: *scur}
		}
		key, err := refunds.RefundInput{TenantID: tenant, OrderID: row.OrderID, RefundID: row.RefundID}.EffectKey(refunds.StepStripe)
		if err != nil {
			return fmt.Errorf("refund %s of order %s/%s: %w", row.RefundID, tenant, row.OrderID, err)
		}
		out[key.String()] = &refundSide{key: key.String(), tenant: tenant, row: &row}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read refund ledger: %w", err)
	}
	return out, nil
}

// refundsMadeIn returns the refunds that Stripe created in w: those
// carrying an effect key by key, and the others (made outside keyed) in a
// list.
func (r *Reconciler) refundsMadeIn(ctx context.Context, w Window) (made map[string][]*stripe.Refund, outside []*stripe.Refund, err error) {
	params := &stripe.RefundListParams{CreatedRange: &stripe.RangeQueryParams{
		GreaterThanOrEqual: ceilUnix(w.From), LesserThan: ceilUnix(w.To)}}
	params.Context, params.Limit = ctx, stripe.Int64(r.pageSize)
	made = map[string][]*stripe.Refund{}
	seen := map[string]bool{}
	it := r.stripe.Refunds.List(params)
	for it.Next() {
		re := it.Refund()
		if seen[re.ID] {
			continue // repeated across pages
		}
		seen[re.ID] = true
		if key := re.Metadata[stripestep.MetadataEffectKey]; key != "" {
			made[key] = append(made[key], re)
		} else {
			outside = append(outside, re)
		}
	}
	if err := it.Err(); err != nil {
		return nil, nil, fmt.Errorf("list Stripe refunds: %w", err)
	}
	return made, outside, nil
}

// refundsOutsideKeyed returns a KindUnrecordedRefund finding for each keyed
// charge (its PaymentIntent carries an effect key; pis spares most requests)
// that Stripe refunded without an effect key, from the Dashboard or the API.
func (r *Reconciler) refundsOutsideKeyed(ctx context.Context, outside []*stripe.Refund, pis map[string][]*stripe.PaymentIntent) ([]Finding, error) {
	known := map[string]*stripe.PaymentIntent{}
	for _, list := range pis {
		for _, pi := range list {
			known[pi.ID] = pi
		}
	}
	byKey := map[string][]*stripe.Refund{}
	charges := map[string]*stripe.PaymentIntent{}
	for _, re := range outside {
		if re.PaymentIntent == nil || re.PaymentIntent.ID == "" {
			continue
		}
		pi, ok := known[re.PaymentIntent.ID]
		if !ok {
			var err error
			if pi, err = r.paymentIntent(ctx, re.PaymentIntent.ID); err != nil {
				return nil, err
			}
			known[re.PaymentIntent.ID] = pi
		}
		if pi == nil || pi.Metadata[stripestep.MetadataEffectKey] == "" {
			continue // not a keyed charge
		}
		key := pi.Metadata[stripestep.MetadataEffectKey]
		byKey[key], charges[key] = append(byKey[key], re), pi
	}
	var found []Finding
	for key, res := range byKey {
		slices.SortStableFunc(res, func(a, b *stripe.Refund) int { return cmp.Compare(a.Created, b.Created) })
		f := Finding{Kind: KindUnrecordedRefund, TenantID: tenantOf(key, nil, []*stripe.PaymentIntent{charges[key]}), EffectKey: key,
			Detail: fmt.Sprintf("Stripe refunded %s of payment intent %s without an effect_key: made outside keyed, so refund_ledger has no row for it",
				refundIDs(res), charges[key].ID)}
		for _, re := range res {
			f.ProviderRefunds = append(f.ProviderRefunds, refundOutcome(re))
		}
		found = append(found, f)
	}
	return found, nil
}

// sideOf returns keyed's side of a refund Stripe made under key, whose
// ledger row (if any) was reserved outside the window.
func (r *Reconciler) sideOf(ctx context.Context, key string, made []*stripe.Refund) (*refundSide, error) {
	s := &refundSide{key: key}
	for _, re := range made {
		s.tenant = cmp.Or(s.tenant, re.Metadata[stripestep.MetadataTenantID])
	}
	k, err := effects.ParseKey(key)
	if err != nil {
		return s, nil
	}
	s.tenant = k.Tenant()
	p := k.Parts()
	if len(p) != 5 || p[0] != "order" || p[2] != "refund" || p[4] != refunds.StepStripe {
		return s, nil // no refund's key: no ledger row can have it
	}
	rows, err := r.ledgerSides(ctx, `l.tenant_id = $1 AND l.order_id = $2 AND l.refund_id = $3`, k.Tenant(), p[1], p[3])
	if err != nil {
		return nil, err
	}
	if rows[key] != nil {
		return rows[key], nil
	}
	return s, nil
}

// complete reads the rest of s: the refund_stripe record, the order's charged
// payment intent and every Stripe refund under s.key, among made and on the
// payment intents the refund may be on; listed caches refunds per intent.
func (r *Reconciler) complete(ctx context.Context, s *refundSide, made []*stripe.Refund,
	pis map[string][]*stripe.PaymentIntent, listed map[string][]*stripe.Refund) error {
	var err error
	if s.step, err = r.record(ctx, s.key); err != nil {
		return err
	}
	if s.row != nil {
		if s.chargePI, err = r.chargedIntent(ctx, s.tenant, s.row.OrderID, pis); err != nil {
			return err
		}
	}
	on := []string{s.chargePI}
	if s.row != nil && s.row.Stripe != nil {
		on = append(on, s.row.Stripe.PaymentIntentID)
	}
	for _, re := range made {
		if re.PaymentIntent != nil {
			on = append(on, re.PaymentIntent.ID)
		}
	}
	s.stripe = slices.Clone(made)
	for _, pi := range slices.Compact(slices.Sorted(slices.Values(on))) {
		if pi == "" {
			continue
		}
		res, ok := listed[pi]
		if !ok {
			if res, err = r.refundsOf(ctx, pi); err != nil {
				return err
			}
			listed[pi] = res
		}
		for _, re := range res {
			if re.Metadata[stripestep.MetadataEffectKey] == s.key && !slices.ContainsFunc(s.stripe, func(o *stripe.Refund) bool { return o.ID == re.ID }) {
				s.stripe = append(s.stripe, re)
			}
		}
	}
	slices.SortStableFunc(s.stripe, func(a, b *stripe.Refund) int { return cmp.Compare(a.Created, b.Created) })
	return nil
}

// chargedIntent returns the payment intent the order was charged on: the
// one its charge record stores, else the succeeded one the charge pass
// found under the charge's key, else "".
func (r *Reconciler) chargedIntent(ctx context.Context, tenant, order string, pis map[string][]*stripe.PaymentIntent) (string, error) {
	key, err := orders.NewOrderInput(tenant, order).EffectKey(orders.StepCharge)
	if err != nil {
		return "", nil
	}
	rec, err := r.record(ctx, key.String())
	if err != nil {
		return "", err
	}
	if rec != nil && rec.State == effects.StateSucceeded {
		var res orders.ChargeResult
		cl := effects.Claim{Result: rec.Result}
		if cl.Decode(&res) == nil && res.PaymentIntentID != "" {
			return res.PaymentIntentID, nil
		}
	}
	for _, pi := range pis[key.String()] {
		if pi.Status == stripe.PaymentIntentStatusSucceeded {
			return pi.ID, nil
		}
	}
	return "", nil
}

// refundsOf returns every refund of the payment intent id, or nil when
// Stripe has no such payment intent.
func (r *Reconciler) refundsOf(ctx context.Context, id string) ([]*stripe.Refund, error) {
	params := &stripe.RefundListParams{PaymentIntent: stripe.String(id)}
	params.Context, params.Limit = ctx, stripe.Int64(r.pageSize)
	var out []*stripe.Refund
	it := r.stripe.Refunds.List(params)
	for it.Next() {
		out = append(out, it.Refund())
	}
	err := it.Err()
	var se *stripe.Error
	if errors.As(err, &se) && (se.HTTPStatusCode == http.StatusNotFound || se.Code == stripe.ErrorCodeResourceMissing) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list Stripe refunds of payment intent %s: %w", id, err)
	}
	return out, nil
}

// checkRefund compares keyed's side of one refund with Stripe's refunds
// under its key. It reports inFlight, and no findings, for a refund whose
// Stripe step holds a live lease, or is younger than grace and has not
// recorded an answer.
func checkRefund(s *refundSide, dbNow time.Time, grace time.Duration) (found []Finding, inFlight bool) {
	base := Finding{TenantID: s.tenant, EffectKey: s.key, Refund: s.row}
	for _, re := range s.stripe {
		base.ProviderRefunds = append(base.ProviderRefunds, refundOutcome(re))
	}
	if s.step != nil {
		base.RecordState = s.step.State
	}
	add := func(kind Kind, format string, args ...any) {
		f := base
		f.Kind, f.Detail = kind, fmt.Sprintf(format, args...)
		found = append(found, f)
	}
	live := s.step != nil && s.step.State == effects.StateClaimed && s.step.LeaseUntil != nil && s.step.LeaseUntil.After(dbNow)
	young := s.row != nil && dbNow.Sub(s.row.ReservedAt) < grace
	var active []*stripe.Refund
	for _, re := range s.stripe {
		if re.Status != stripe.RefundStatusFailed && re.Status != stripe.RefundStatusCanceled {
			active = append(active, re)
		}
	}

	if len(active) > 1 {
		add(KindDoubleRefund, "%d refunds at Stripe carry this effect key: %s", len(active), refundIDs(active))
	}
	switch {
	case s.row == nil:
		if len(active) > 0 {
			add(KindUnrecordedRefund, "Stripe refunded %s under this key, and refund_ledger has no row for it", refundIDs(active))
		}
	case s.row.ReleasedAt != nil:
		if len(active) > 0 {
			add(KindReleasedButRefunded, "keyed released this refund at %s after Stripe refused it (%s), and Stripe refunded %s under this key",
				s.row.ReleasedAt.UTC().Format(time.RFC3339), s.row.ReleaseCode, refundIDs(active))
		}
	case len(active) == 0:
		switch {
		case live:
			return nil, true
		case s.row.Stripe != nil:
			add(KindRefundMissingAtProvider, "keyed recorded Stripe refund %s, and Stripe has %s under this key",
				s.row.Stripe.RefundID, noneOr(s.stripe))
		case s.step != nil && s.step.State == effects.StateSucceeded:
			add(KindRefundMissingAtProvider, "the refund_stripe step succeeded, and Stripe has %s under this key", noneOr(s.stripe))
		case young:
			return nil, true
		default:
			add(KindRefundMissingAtProvider, "reserved at %s, the refund_stripe step is %s, and Stripe has %s under this key",
				s.row.ReservedAt.UTC().Format(time.RFC3339), stepState(s.step), noneOr(s.stripe))
		}
	case s.row.Stripe == nil:
		if live || young {
			return found, true
		}
		add(KindUnrecordedRefund, "Stripe refunded %s under this key, and keyed recorded no Stripe answer (the refund_stripe step is %s)",
			refundIDs(active), stepState(s.step))
		mismatch(add, s, active)
	default:
		mismatch(add, s, active)
	}
	return found, false
}

// mismatch adds a KindRefundMismatch finding when s's ledger row or
// recorded outcome differs from Stripe's refund under its key.
func mismatch(add func(Kind, string, ...any), s *refundSide, active []*stripe.Refund) {
	re := active[0]
	if out := s.row.Stripe; out != nil {
		i := slices.IndexFunc(active, func(re *stripe.Refund) bool { return re.ID == out.RefundID })
		if i < 0 {
			add(KindRefundMismatch, "keyed recorded Stripe refund %s, but Stripe's refund under this key is %s", out.RefundID, refundIDs(active))
			return
		}
		re = active[i]
	}
	if diff := refundDifferences(s, re); diff != "" {
		add(KindRefundMismatch, "keyed and Stripe disagree on refund %s: %s", re.ID, diff)
	}
}

// refundDifferences describes how s's ledger row, recorded outcome and
// charged payment intent differ from Stripe's refund re, or returns "".
func refundDifferences(s *refundSide, re *stripe.Refund) string {
	var d []string
	pi := ""
	if re.PaymentIntent != nil {
		pi = re.PaymentIntent.ID
	}
	if s.row.AmountMinor != re.Amount {
		d = append(d, fmt.Sprintf("amount %d in the ledger, %d at Stripe", s.row.AmountMinor, re.Amount))
	}
	if out := s.row.Stripe; out != nil {
		if out.AmountMinor != re.Amount || !strings.EqualFold(out.Currency, string(re.Currency)) {
			d = append(d, fmt.Sprintf("amount %d %s recorded, %d %s at Stripe", out.AmountMinor, out.Currency, re.Amount, re.Currency))
		}
		if out.PaymentIntentID != pi {
			d = append(d, fmt.Sprintf("payment intent %s recorded, %s at Stripe", out.PaymentIntentID, pi))
		}
	}
	if s.chargePI != "" && s.chargePI != pi {
		d = append(d, fmt.Sprintf("the order was charged on %s, and Stripe refunded %s", s.chargePI, pi))
	}
	return strings.Join(d, "; ")
}

func refundOutcome(re *stripe.Refund) refunds.StripeResult {
	out := refunds.StripeResult{RefundID: re.ID, Status: string(re.Status), AmountMinor: re.Amount, Currency: string(re.Currency)}
	if re.PaymentIntent != nil {
		out.PaymentIntentID = re.PaymentIntent.ID
	}
	return out
}

func refundIDs(res []*stripe.Refund) string {
	s := make([]string, len(res))
	for i, re := range res {
		s[i] = re.ID
	}
	return strings.Join(s, ", ")
}

// noneOr says which refunds Stripe has, none being active.
func noneOr(res []*stripe.Refund) string {
	if len(res) == 0 {
		return "no refund"
	}
	s := make([]string, len(res))
	for i, re := range res {
		s[i] = re.ID + " " + string(re.Status)
	}
	return "only " + strings.Join(s, ", ")
}

func stepState(rec *effects.Record) string {
	if rec == nil {
		return "not claimed"
	}
	return string(rec.State)
}
