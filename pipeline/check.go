package pipeline

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/step"
)

// Problem is one thing wrong with a Decision field, such as reason "is
// required".
type Problem struct {
	Field string
	Text  string
}

// DecisionError is a Decision refused before it is applied, with every
// problem it has.
type DecisionError struct {
	Problems []Problem
}

func (e *DecisionError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.Field + " " + p.Text
	}
	return "decision refused: " + strings.Join(parts, "; ")
}

// CheckDecision returns a *DecisionError naming every problem of d as a
// decision on the step named step, whose "done" outcome rule is outcome
// (nil: any JSON result), or nil: the step must match, the resolution be
// done or retry, reason and by be given within their limits, a done carry
// a result outcome accepts, a retry neither a result nor unverified.
func CheckDecision(d Decision, step string, outcome step.Outcome) error {
	var ps []Problem
	add := func(field, format string, args ...any) {
		ps = append(ps, Problem{Field: field, Text: fmt.Sprintf(format, args...)})
	}
	stepOK := d.Step == step
	if !stepOK {
		add("step", "%q is not waiting; %q is", d.Step, step)
	}
	resolutionOK := d.Resolution == effects.ResolveDone || d.Resolution == effects.ResolveRetry
	if !resolutionOK {
		add("resolution", "%q is neither %q nor %q", d.Resolution, effects.ResolveDone, effects.ResolveRetry)
	}
	if text := textProblem(d.Reason, MaxDecisionReason); text != "" {
		add("reason", "%s", text)
	}
	if text := textProblem(d.By, MaxDecisionBy); text != "" {
		add("by", "(who decides) %s", text)
	}
	switch {
	case d.Resolution == effects.ResolveRetry && len(d.Result) > 0:
		add("result", "goes with done only: a retry takes no result")
	case d.Resolution == effects.ResolveRetry && d.Unverified:
		add("unverified", "goes with done only: a retry checks nothing")
	case d.Resolution == effects.ResolveDone && stepOK:
		if text := resultProblem(d.Result, outcome); text != "" {
			add("result", "%s", text)
		}
	}
	if ps == nil {
		return nil
	}
	return &DecisionError{Problems: ps}
}

// textProblem says what is wrong with s, trimmed, as a required field of
// one line of printable text, at most limit bytes.
func textProblem(s string, limit int) string {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return "is required"
	case len(s) > limit:
		return fmt.Sprintf("is too long: %d bytes, at most %d", len(s), limit)
	}
	for i, r := range s {
		if r == utf8.RuneError || !strconv.IsPrint(r) || unicode.Is(unicode.Cf, r) {
			return fmt.Sprintf("holds %s at byte %d, a control or invisible character: give one line of printable text",
				strconv.QuoteRune(r), i)
		}
	}
	return ""
}

// resultProblem says what is wrong with result as a done outcome under
// outcome, without the field's name: "is required …", "is larger than …",
// or outcome's problems.
func resultProblem(result json.RawMessage, outcome step.Outcome) string {
	raw := bytes.TrimSpace(result)
	switch {
	case len(raw) > effects.MaxResultBytes:
		return fmt.Sprintf("is too large: %d bytes, at most %d", len(raw), effects.MaxResultBytes)
	case outcome != nil:
		if _, err := outcome.Decode(raw); err != nil {
			msg := err.Error()
			if rest, ok := strings.CutPrefix(msg, "result: "); ok {
				return "is not the step's outcome: " + rest
			}
			return strings.TrimPrefix(msg, "result ")
		}
		return ""
	case len(raw) == 0 || bytes.Equal(raw, []byte("null")):
		return "is required with done: the step's outcome as JSON"
	case !json.Valid(raw):
		return "is not valid JSON"
	}
	return ""
}
