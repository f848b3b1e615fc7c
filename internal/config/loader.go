package config

import (
	"flag"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Loader reads a Config in two phases, so that a program can add its own
// flags next to the configuration's: NewLoader picks the program, BindFlags
// reads the environment and adds the overriding flags to a FlagSet, and
// Load, called after the FlagSet is parsed, validates. Omit and Command
// must come before BindFlags.
type Loader struct {
	role   Role
	uses   Uses
	lookup func(string) (string, bool)
	omit   map[FlagGroup]bool
	cfg    Config
	read   bool
	// envProblems holds what is wrong with the variables that did not
	// parse, by name; a flag given for the same setting overrides it.
	envProblems map[string]string
	// problems are those added by Problem, reported whatever the flags.
	problems []string
	checks   []func(c *Config, add func(name, format string, args ...any))
	fs       *flag.FlagSet
	// environ is the names of the process's variables, checked for
	// misspelled settings (Environ).
	environ []string
}

// NewLoader returns a Loader of the settings role reads, through lookup
// (normally os.LookupEnv).
func NewLoader(role Role, lookup func(string) (string, bool)) *Loader {
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	return &Loader{role: role, uses: role.uses(), lookup: lookup}
}

// Command adds the settings of the starter command name (CommandUses) to
// those the Loader reads.
func (l *Loader) Command(name string) { l.uses |= CommandUses(name) }

// Omit leaves groups out, for a program that never uses those settings:
// they keep their defaults, get no flag and are not checked.
func (l *Loader) Omit(groups ...FlagGroup) {
	if l.omit == nil {
		l.omit = map[FlagGroup]bool{}
	}
	for _, g := range groups {
		l.omit[g] = true
	}
}

// Problem adds a problem with the setting name (a variable or a flag) that
// Load reports with the others. The message must not hold a secret.
func (l *Loader) Problem(name, format string, args ...any) {
	l.problems = append(l.problems, name+": "+fmt.Sprintf(format, args...))
}

// Environ gives Load the process's environment (os.Environ), whose
// variables it checks for misspelled settings: each variable that is no
// setting but looks like one misspelled (Misspelled) is a problem that
// names it and the setting it probably stands for, never its value.
func (l *Loader) Environ(environ []string) {
	l.environ = l.environ[:0]
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		l.environ = append(l.environ, name)
	}
}

// notSettings returns names without those NotSettings lists.
func notSettings(names []string, c *Config) []string {
	listed := map[string]bool{}
	for _, n := range strings.Split(c.NotSettings, ",") {
		listed[strings.TrimSpace(n)] = true
	}
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return listed[n] })
}

// Check adds fn, which Load runs on the parsed configuration after the
// table's checks: fn reports each problem through add, which names the
// setting (a variable) as the table's problems are named.
func (l *Loader) Check(fn func(c *Config, add func(name, format string, args ...any))) {
	l.checks = append(l.checks, fn)
}

// BindFlags adds to fs a flag for each setting the Loader reads that has
// one, defaulting to the value read from the environment. Flags win over
// the environment once fs is parsed.
func (l *Loader) BindFlags(fs *flag.FlagSet) {
	l.readEnv()
	l.fs = fs
	for i := range Settings {
		if s := &Settings[i]; s.Flag != "" && l.active(s) {
			bindFlag(fs, s.field(&l.cfg), s.Flag, s.Help+" (env "+s.Env+")")
		}
	}
}

// Load validates the configuration and returns it. The error lists every
// problem, one setting per line, sorted, and never contains a secret.
func (l *Loader) Load() (*Config, error) {
	l.readEnv()
	c := l.cfg
	set := map[string]bool{}
	if l.fs != nil {
		l.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	}
	overridden := func(name string) bool { fl := l.flagOf(name); return fl != "" && set[fl] }
	var problems []string
	add := func(name, format string, args ...any) {
		if fl := l.flagOf(name); fl != "" {
			name += " (--" + fl + ")"
		}
		problems = append(problems, name+": "+fmt.Sprintf(format, args...))
	}
	for name, p := range l.envProblems {
		if !overridden(name) {
			add(name, "%s", p)
		}
	}
	problems = append(problems, l.problems...)
	for name, meant := range Misspelled(notSettings(l.environ, &c)) {
		problems = append(problems, fmt.Sprintf("%s: not a setting; did you mean %s? Rename or unset it, "+
			"or list it in %s if another program reads it", name, meant, NotSettingsEnv))
	}
	for i := range Settings {
		if s := &Settings[i]; s.Field != "" && l.active(s) && (l.envProblems[s.Env] == "" || overridden(s.Env)) {
			l.checkRow(s, &c, add)
		}
	}
	if l.temporalActive() {
		l.checkTemporal(c.Temporal, add)
	}
	for _, fn := range l.checks {
		fn(&c, add)
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, &Error{Role: c.Role, Problems: problems}
	}
	return &c, nil
}

// checkRow reports what is wrong with the value of s in c: empty while the
// program requires it, or refused by its check. An optional setting left
// empty is not checked.
func (l *Loader) checkRow(s *Setting, c *Config, add func(name, format string, args ...any)) {
	f := s.field(c)
	switch {
	case f.IsZero() && s.Required&l.uses != 0:
		add(s.Env, "required (%s)", s.help())
	case f.IsZero() && s.defaultValue(l.role, f.Type()).IsZero():
	case s.Check != nil:
		if err := s.Check(f.Interface(), c); err != nil {
			add(s.Env, "%v", err)
		}
	}
}

// Load is NewLoader and Parse in one call.
func Load(role Role, fs *flag.FlagSet, args []string, lookup func(string) (string, bool)) (*Config, error) {
	return NewLoader(role, lookup).Parse(fs, args)
}

// Parse is BindFlags, fs.Parse(args) and Load in one call, for a program
// whose only flags are the configuration's. A flag error is returned as
// is (flag.ErrHelp for -h).
func (l *Loader) Parse(fs *flag.FlagSet, args []string) (*Config, error) {
	l.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%s: unexpected arguments: %s", l.role, strings.Join(fs.Args(), " "))
	}
	return l.Load()
}

// readEnv fills the Config once: each setting the Loader reads gets its
// default, then the variable's value. The Temporal config file's profile
// comes first: its address and namespace stand in for the defaults.
func (l *Loader) readEnv() {
	if l.read {
		return
	}
	l.read = true
	c := &l.cfg
	c.Role, c.uses, c.omit = l.role, l.uses, l.omit
	if l.temporalActive() {
		l.loadTemporal()
	}
	for i := range Settings {
		s := &Settings[i]
		if s.Field == "" || s.For&l.uses == 0 {
			continue
		}
		f := s.field(c)
		if f.IsZero() {
			f.Set(s.defaultValue(l.role, f.Type()))
		}
		if l.omit[s.Group] {
			continue
		}
		v, ok := l.lookup(s.Env)
		if v = strings.TrimSpace(v); !ok || v == "" {
			continue
		}
		x, err := parse(f.Type(), v)
		if err != nil {
			l.problem(s.Env, "%v", err)
			continue
		}
		f.Set(x)
	}
}

// active reports whether the Loader reads, binds and checks s.
func (l *Loader) active(s *Setting) bool { return s.For&l.uses != 0 && !l.omit[s.Group] }

func (l *Loader) temporalActive() bool {
	for i := range Settings {
		if s := &Settings[i]; s.Group == TemporalFlags && l.active(s) {
			return true
		}
	}
	return false
}

// flagOf returns the flag bound for the variable name, or "".
func (l *Loader) flagOf(name string) string {
	for i := range Settings {
		s := &Settings[i]
		if s.Env == name && s.Flag != "" && l.active(s) && l.fs != nil && l.fs.Lookup(s.Flag) != nil {
			return s.Flag
		}
	}
	return ""
}

func (l *Loader) problem(name, format string, args ...any) {
	if l.envProblems == nil {
		l.envProblems = map[string]string{}
	}
	l.envProblems[name] = fmt.Sprintf(format, args...)
}
