package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// maxWidth is the widest line the report prints.
const maxWidth = 100

// report prints the table of the scenarios' outcomes, their details, the
// refunds' table and details, and the totals.
func (s *stack) report(ctx context.Context, list []*demoOrder, refundList []*demoRefund, dups int) error {
	rows, err := s.rows(ctx, list)
	if err != nil {
		return err
	}
	if err := printReport(s.out, rows, dups, s.stripeFake != nil); err != nil {
		return err
	}
	refundRows, err := s.refundRows(ctx, refundList)
	if err != nil {
		return err
	}
	if err := printRefunds(s.out, refundRows, dups, s.stripeFake != nil); err != nil {
		return err
	}
	return s.printTotals(ctx)
}

// printStopped says that everything has stopped and how to keep it up.
func (s *stack) printStopped() error {
	_, err := fmt.Fprintf(s.out, "\nEverything has stopped. Run `make demo KEEP=1` to keep the servers up and explore the runs\n"+
		"in the Temporal Web UI and with bin/starter. Worker log: %s\n", s.logPath)
	return err
}

// printReport prints the table, what its columns mean, and each order's
// details; no line is wider than maxWidth columns.
func printReport(w io.Writer, rows []row, dups int, fake bool) error {
	t, err := table(rows)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(w, "\n"+t+legend(dups, fake)); err != nil {
		return err
	}
	for _, r := range rows {
		if err := printDetails(w, r); err != nil {
			return err
		}
	}
	return nil
}

// table returns the report's table, one line per row, its columns aligned.
func table(rows []row) (string, error) {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	lines := []string{"ORDER\tSCENARIO\tNEW\tDUPLICATE\tLATER START\tOUTCOME\tCHARGES"}
	for _, r := range rows {
		lines = append(lines, r.tableLine())
	}
	if _, err := io.WriteString(tw, strings.Join(lines, "\n")+"\n"); err != nil {
		return "", err
	}
	if err := tw.Flush(); err != nil {
		return "", err
	}
	return b.String(), nil
}

// tableLine is r's line of the table, its cells separated by tabs.
func (r row) tableLine() string {
	charges := "n/a"
	if r.charges >= 0 {
		charges = fmt.Sprint(r.charges)
	}
	later := "refused"
	if r.later != "refused" {
		later = "re-ran"
	}
	return fmt.Sprintf("%s\t%s\t%d\t%d\t%s\t%s\t%s", truncate(r.order, 12), truncate(r.scenario, 20), r.runs, r.duplicates,
		later, truncate(r.outcome, 24), charges)
}

// legend explains the table's columns in words.
func legend(dups int, fake bool) string {
	s := fmt.Sprintf(`
Each order got %d concurrent starts, all with the order's one workflow ID. NEW counts the starts
that began a workflow run (1). DUPLICATE counts the starts Temporal suppressed because that run
was already going: they joined it instead of charging again. LATER START is one more start fired
after the run had finished: refused for a paid order. A failed order may start a new run, which
refuses to charge (a failed order is final) and calls Stripe no more.
`, dups)
	if fake {
		s += `CHARGES counts the charges the fake Stripe made for the order: one for each paid order despite
the duplicate starts, the lost response and the 500, and none for the declined card.
`
	}
	return s
}

// printDetails prints one order's workflow ID, charge, receipt and effect
// records, each cut to fit maxWidth.
func printDetails(w io.Writer, r row) error {
	lines := [][2]string{
		{"workflow", r.workflowID},
		{"charge", r.charge},
		{"receipt", r.receipt},
		{"effects", r.effects},
	}
	if r.later != "refused" {
		lines = append(lines, [2]string{"re-run", "ended " + strings.TrimPrefix(r.later, "re-ran: ")})
	}
	if _, err := fmt.Fprintf(w, "\n%s\n", r.order); err != nil {
		return err
	}
	for _, l := range lines {
		if _, err := fmt.Fprintf(w, "  %-9s %s\n", l[0], truncate(l[1], maxWidth-12)); err != nil {
			return err
		}
	}
	return nil
}

// printTotals prints what the fake Stripe saw and the worker's count of
// duplicates its effect records suppressed.
func (s *stack) printTotals(ctx context.Context) error {
	var b strings.Builder
	b.WriteString("\n")
	if s.stripeFake != nil {
		fmt.Fprintf(&b, "Stripe saw %d create requests and made %d charges and %d refunds.\n", s.stripeFake.Requests(),
			s.stripeFake.Charges(), s.stripeFake.Refunds())
	}
	if counts, err := scrapeSuppressed(ctx, "http://"+s.metricsAddr+"/metrics"); err != nil {
		fmt.Fprintf(&b, "The worker's metrics could not be read: %v\n", err)
	} else {
		fmt.Fprintf(&b, "Effect records suppressed repeated side effects: %s\n"+
			"(worker metric keyed_effect_duplicates_suppressed_total, by effect kind)\n", counts)
	}
	_, err := io.WriteString(s.out, b.String())
	return err
}

// scrapeSuppressed reads keyed_effect_duplicates_suppressed_total from the
// worker's /metrics as "charge 2, receipt 0", or "none".
func scrapeSuppressed(ctx context.Context, u string) (string, error) {
	body, err := get(ctx, u)
	if err != nil {
		return "", err
	}
	return suppressed(body), nil
}

// get returns the body of a GET of u, waiting at most 5 seconds. A status
// other than 200 is an error.
func get(ctx context.Context, u string) (body []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { err = joinErr(err, resp.Body.Close()) }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
	}
	return io.ReadAll(resp.Body)
}

// suppressed returns the samples of keyed_effect_duplicates_suppressed_total
// in a Prometheus text exposition as "charge 2, receipt 0", or "none".
func suppressed(body []byte) string {
	const name = "keyed_effect_duplicates_suppressed_total"
	var parts []string
	for line := range strings.SplitSeq(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		kind := labels
		if _, v, ok := strings.Cut(labels, `kind="`); ok {
			kind, _, _ = strings.Cut(v, `"`)
		}
		parts = append(parts, kind+" "+value)
	}
	if len(parts) == 0 {
		return "none"
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// envPath is where the demo writes the CLI's settings while it keeps its
// servers up.
func envPath() string { return stateDir + "/env" }

// writeEnvFile writes vars ("NAME=value") as export lines a POSIX shell
// can source, under a line naming demo id and this process, and returns
// what it wrote. It is readable by its owner only: DATABASE_URL may hold a
// password.
func writeEnvFile(path, id string, vars []string) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by demo %s, process %d.\n", id, os.Getpid())
	b.WriteString("# `make demo KEEP=1` keeps its servers running; this file goes when they stop.\n")
	b.WriteString("# source .demo/env, then run bin/starter (e.g. bin/starter show --tenant \"$KEYED_DEMO_TENANT\" --order ID).\n")
	for _, v := range vars {
		name, value, _ := strings.Cut(v, "=")
		fmt.Fprintf(&b, "export %s=%s\n", name, shellQuote(value))
	}
	out := []byte(b.String())
	return out, os.WriteFile(path, out, 0o600)
}

// shellQuote quotes s for a POSIX shell: inside single quotes, with each
// single quote written as '\”.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// printKeep prints the settings written to path (DATABASE_URL's password
// masked) and how to use them.
func printKeep(w io.Writer, path string, vars []string, order, logPath string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\nThe servers stay up until Ctrl-C. Their settings for bin/starter are in %s:\n\n", path)
	for _, v := range vars {
		name, value, _ := strings.Cut(v, "=")
		if name == "DATABASE_URL" {
			value = maskPassword(value)
		}
		fmt.Fprintf(&b, "  %s=%s\n", name, value)
	}
	fmt.Fprintf(&b, "\nTry:\n  source %s\n", path)
	fmt.Fprintf(&b, "  bin/starter show --tenant \"$KEYED_DEMO_TENANT\" --order %s\n", order)
	b.WriteString("  bin/starter create --tenant \"$KEYED_DEMO_TENANT\" --order E-1 --amount 1999 --currency eur \\\n" +
		"      --email ada@example.com --payment-method pm_card_visa\n")
	fmt.Fprintf(&b, "  bin/starter refund --tenant \"$KEYED_DEMO_TENANT\" --order %s --refund R1 --amount 250 --reason damaged\n", order)
	fmt.Fprintf(&b, "The demo's runs in the Temporal Web UI: KEYED_DEMO_WEB_UI above. Worker log: %s\n", logPath)
	_, err := io.WriteString(w, b.String())
	return err
}

// maskPassword returns a URL with its password, if any, shown as xxxxx.
func maskPassword(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(DATABASE_URL: see the file)"
	}
	return u.Redacted()
}
