package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/reconcile"
	"github.com/keyedhq/keyed/refunds"
)

// exitFindings is reconcile's exit status when it found disagreements.
const exitFindings = 3

// errFindings is returned by reconcile after printing its findings; run
// turns it into exitFindings.
var errFindings = errors.New("reconciliation found disagreements")

func runReconcile(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "reconcile", "[--since 24h] [--until now] [--json] [flags]",
		"Compares the charge records keyed stored with the PaymentIntents Stripe created in the same window\n"+
			"that carry an effect_key, and prints every disagreement: extra_charges (one effect key charged more\n"+
			"than once), missing_record (Stripe charged; keyed has no succeeded record), mismatch (the stored\n"+
			"payment intent, amount or status differs from Stripe's) and missing_at_provider (keyed recorded a\n"+
			"charge Stripe does not have). It compares the refund ledger with the refunds Stripe made likewise:\n"+
			"double_refund (one refund made twice), unrecorded_refund (Stripe refunded; keyed has no ledger row or\n"+
			"no recorded answer), refund_mismatch (amount, refund or payment intent differs) and\n"+
			"refund_missing_at_provider (keyed shows a refund Stripe never made) and released_but_refunded (keyed\n"+
			"gave back the reservation of a refund Stripe refused, yet Stripe refunded it). It only reads. Run it daily with\n"+
			"--since 25h: the overlap with the previous run is harmless and catches what straddles the boundary.\n"+
			"\n"+
			"Besides DATABASE_URL it needs STRIPE_SECRET_KEY, from the environment only (a restricted key that\n"+
			"can read PaymentIntents and Refunds is enough).\n"+
			"\n"+
			"Exit status: 0 when keyed and Stripe agree, 3 when there are findings, 1 when Postgres or Stripe\n"+
			"failed, 2 for bad input.",
		config.TemporalFlags, config.MigrateFlag)
	since := f.String("since", "24h", "start of the window: a `duration` before now, such as 25h, or an RFC 3339 time")
	until := f.String("until", "now", "end of the window, exclusive: now, a `duration` before now, or an RFC 3339 time")
	asJSON := f.Bool("json", false, "print the report as JSON")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	// Load checked the key and the base URL, all the client checks.
	sc, err := stripestep.NewClient(string(cfg.Stripe.SecretKey), cfg.Stripe.APIBase, nil)
	if err != nil {
		return usagef("STRIPE_API_BASE: %v", err)
	}
	now := time.Now().UTC()
	var w reconcile.Window
	if w.From, err = parseWhen("since", *since, now); err != nil {
		return err
	}
	if w.To, err = parseWhen("until", *until, now); err != nil {
		return err
	}
	if err := w.Validate(); err != nil {
		return usagef("--since %s is not before --until %s", w.From.Format(time.RFC3339), w.To.Format(time.RFC3339))
	}

	var (
		pool   *pgxpool.Pool
		fxc    *effects.Client
		logger *slog.Logger
	)
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		r, err := reconcile.New(fxc, pool, sc, &reconcile.Opts{Logger: logger})
		if err != nil {
			return err
		}
		rep, err := r.Run(ctx, w)
		if err != nil {
			return migrationHint(ctx, pool, cfg, err)
		}
		if *asJSON {
			err = writeJSON(e.stdout, rep)
		} else {
			err = printReport(e.stdout, rep)
		}
		if err != nil {
			return err
		}
		if !rep.Clean() {
			return errFindings
		}
		return nil
	}, &pool, &fxc, &logger)
}

// parseWhen parses a --since or --until value: "now", a duration before
// now, or an RFC 3339 time.
func parseWhen(name, s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "now" {
		return now, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, usagef("invalid --%s: %s is negative; give how long before now", name, s)
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), nil
	}
	return time.Time{}, usagef("invalid --%s: %q is not now, a duration such as 25h, or an RFC 3339 time such as 2026-03-01T00:00:00Z", name, s)
}

// printReport prints the report as a summary and one row per finding.
func printReport(w io.Writer, rep *reconcile.Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "window\t%s to %s\n", rep.Window.From.UTC().Format(time.RFC3339), rep.Window.To.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "charge records\t%d\n", rep.Records)
	fmt.Fprintf(tw, "payment intents\t%d (at Stripe, with an effect_key)\n", rep.PaymentIntents)
	fmt.Fprintf(tw, "refunds\t%d (in the ledger)\n", rep.Refunds)
	fmt.Fprintf(tw, "stripe refunds\t%d (at Stripe, with an effect_key)\n", rep.StripeRefunds)
	fmt.Fprintf(tw, "in flight\t%d (skipped: still running; the next run checks them)\n", rep.InFlight)
	fmt.Fprintf(tw, "findings\t%d\n", len(rep.Findings))
	if err := tw.Flush(); err != nil {
		return err
	}
	if rep.Clean() {
		_, err := fmt.Fprintln(w, "\nno findings: keyed and Stripe agree")
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tTENANT\tEFFECT KEY\tRECORD\tSTRIPE\tDETAIL")
	for _, f := range rep.Findings {
		record := "none"
		switch {
		case f.Record != nil:
			record = charge(*f.Record)
		case f.Refund != nil:
			record = findingLedgerRow(*f.Refund)
		case f.RecordState != "":
			record = string(f.RecordState)
		}
		var stripe []string
		for _, p := range f.Provider {
			stripe = append(stripe, charge(p))
		}
		for _, p := range f.ProviderRefunds {
			stripe = append(stripe, findingRefund(p))
		}
		if len(stripe) == 0 {
			stripe = []string{"none"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.Kind, f.TenantID, f.EffectKey, record, strings.Join(stripe, ", "), f.Detail)
	}
	return tw.Flush()
}

// findingLedgerRow renders a refund's ledger row as "refund r1 4.00 USD", and
// its recorded Stripe answer after it.
func findingLedgerRow(r reconcile.RefundRecord) string {
	s := "refund " + r.RefundID + " " + orders.FormatAmount(r.AmountMinor, r.Currency)
	if r.Stripe != nil {
		s += " as " + findingRefund(*r.Stripe)
	}
	return s
}

// findingRefund renders a Stripe refund as "re_… succeeded 4.00 USD of pi_…".
func findingRefund(r refunds.StripeResult) string {
	return r.RefundID + " " + r.Status + " " + orders.FormatAmount(r.AmountMinor, r.Currency) + " of " + r.PaymentIntentID
}

// charge renders a charge outcome as "pi_… succeeded 19.99 USD".
func charge(c orders.ChargeResult) string {
	return c.PaymentIntentID + " " + c.Status + " " + orders.FormatAmount(c.AmountMinor, c.Currency)
}
