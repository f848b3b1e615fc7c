package doctor

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteText writes the report for people: one line per check (status,
// check, subject, evidence), the fix under each check that did not pass,
// and a summary with the exit code.
func (r *Report) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "keyed doctor: namespace %s, %s\n\n", r.Namespace, r.At.Format("2006-01-02 15:04:05 UTC"))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tCHECK\tSUBJECT\tEVIDENCE")
	counts := map[Status]int{}
	for _, c := range r.Checks {
		counts[c.Status]++
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", strings.ToUpper(string(c.Status)), c.Name, c.Subject, c.Evidence)
		if c.Fix != "" && c.Status != StatusPass {
			fmt.Fprintf(tw, "\t\t\tfix: %s\n", c.Fix)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%d pass, %d warn, %d fail, %d could not check: exit %d\n",
		counts[StatusPass], counts[StatusWarn], counts[StatusFail], counts[StatusError], r.ExitCode())
	return err
}
