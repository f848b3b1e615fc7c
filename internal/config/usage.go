package config

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Usage writes, for -h, one line for each setting of the programs in uses
// as role reads them: its variable, its help, "required" where one of uses
// requires it, its default, and "environment only" for a secret.
func Usage(w io.Writer, role Role, uses Uses) {
	for i := range Settings {
		s := &Settings[i]
		if s.For&uses == 0 {
			continue
		}
		text := s.help()
		if s.Required&uses != 0 {
			text = "required: " + text
		}
		if d := s.defaultText(role, strconv.Quote); d != "" {
			text += " (default " + d + ")"
		}
		if s.Secret {
			text += " (environment only)"
		}
		const width = 21
		if len(s.Env) > width {
			fmt.Fprintf(w, "  %s\n  %-*s %s\n", s.Env, width, "", text)
		} else {
			fmt.Fprintf(w, "  %-*s %s\n", width, s.Env, text)
		}
	}
}

// defaultText returns the default of s for role as -h and the docs show
// it, strings through quote; "" when it has none to show.
func (s *Setting) defaultText(role Role, quote func(string) string) string {
	if s.DefaultDoc != "" {
		return s.DefaultDoc
	}
	if s.Field == "" || s.Default == nil {
		return ""
	}
	v := s.defaultValue(role, s.field(&Config{}).Type()).Interface()
	if str, ok := v.(string); ok {
		if str == "" {
			return ""
		}
		return quote(str)
	}
	return show(v)
}

// PrintFlags writes the flags of fs to w spelled as usage lines spell them,
// "--name value", each followed by its usage indented and its default
// unless that is the zero value. Strings' defaults are quoted.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		var b strings.Builder
		b.WriteString("  --" + f.Name)
		if name != "" {
			b.WriteString(" " + name)
		}
		b.WriteString("\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t"))
		if d := defaultOf(f); d != "" {
			b.WriteString(" (default " + d + ")")
		}
		fmt.Fprintln(w, b.String())
	})
}

// defaultOf returns f's default for help, or "" when it is the zero value.
func defaultOf(f *flag.Flag) string {
	switch f.DefValue {
	case "", "0", "false", "0s":
		return ""
	}
	if g, ok := f.Value.(flag.Getter); ok {
		if _, isString := g.Get().(string); isString {
			return strconv.Quote(f.DefValue)
		}
	}
	return f.DefValue
}
