package config

import (
	"bytes"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// program is one program of the table: the role it loads as and, for a
// single starter command, the command.
type program struct {
	use     Uses
	role    Role
	command string
}

// programsOf returns the programs in u that load a Config.
func programsOf(u Uses) []program {
	var out []program
	for _, p := range programs {
		switch {
		case u&p.use == 0:
		case p.use == InWorker:
			out = append(out, program{p.use, Worker, ""})
		case p.use == InStarter || p.command != "":
			out = append(out, program{p.use, Starter, p.command})
		}
	}
	return out
}

func (p program) loader(env map[string]string) *Loader {
	l := NewLoader(p.role, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	l.Command(p.command)
	return l
}

var envName = regexp.MustCompile(`^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*(_\*)?$`)

// TestSettingsTable checks each row on its own: a well-formed name, at
// most one row per variable and per flag, a field of a type the loader
// parses, a default of that type that passes its own check, no flag for a
// secret, and texts on one line.
func TestSettingsTable(t *testing.T) {
	t.Parallel()
	envs, flags := map[string]bool{}, map[string]bool{}
	for i := range Settings {
		s := &Settings[i]
		require.Regexp(t, envName, s.Env)
		require.False(t, envs[s.Env], "%s: one row per variable", s.Env)
		envs[s.Env] = true
		require.NotZero(t, s.For, "%s: read by some program", s.Env)
		require.Equal(t, s.Required, s.Required&s.For, "%s: required only where read", s.Env)
		require.NotEmpty(t, s.Help, s.Env)
		for _, text := range []string{s.Help, s.Doc, s.DefaultDoc} {
			require.NotContains(t, text, "\n", s.Env)
			require.NotContains(t, text, "|", "%s: the docs page is a Markdown table", s.Env)
		}
		if s.Flag != "" {
			require.False(t, flags[s.Flag], "%s: --%s names one setting", s.Env, s.Flag)
			flags[s.Flag] = true
			require.NotEmpty(t, s.Field, "%s: a flag fills a field", s.Env)
			require.False(t, s.Secret, "%s: a secret has no flag", s.Env)
		}
		if s.Field == "" {
			require.Zero(t, s.Required, "%s: without a field, not required", s.Env)
			require.Nil(t, s.Default, "%s: a default for another reader goes in DefaultDoc", s.Env)
			continue
		}
		f := s.field(&Config{})
		if s.Secret {
			require.True(t, f.Type() == reflect.TypeFor[Secret]() || s.Redact != nil, "%s: a secret's field is a Secret, or the row redacts it", s.Env)
		}
		if s.Required != 0 {
			require.Equal(t, reflect.String, f.Kind(), "%s: required means not empty", s.Env)
			require.NotEmpty(t, s.Example, "%s: a required setting has an Example", s.Env)
		}
		if s.Example != "" {
			v, err := parse(f.Type(), s.Example)
			require.NoError(t, err, s.Env)
			if s.Check != nil {
				c := defaults(Worker)
				require.NoError(t, s.Check(v.Interface(), &c), "%s: its Example passes its check", s.Env)
			}
		}
		if !s.Secret {
			bindFlag(flag.NewFlagSet("x", flag.ContinueOnError), f, "x", "") // every type a flag may have binds
		}
		for _, role := range []Role{Worker, Starter} {
			d := s.defaultValue(role, f.Type())
			require.Equal(t, f.Type(), d.Type(), s.Env)
			if !d.IsZero() {
				back, err := parse(f.Type(), show(d.Interface()))
				require.NoError(t, err, "%s: the default as -h and the docs show it is a value", s.Env)
				require.Equal(t, d.Interface(), back.Interface(), s.Env)
			}
			if s.Check != nil && !d.IsZero() {
				c := defaults(role)
				require.NoError(t, s.Check(d.Interface(), &c), "%s: its default passes its check", s.Env)
			}
		}
	}
}

// defaults returns the Config of every default, for role.
func defaults(role Role) Config {
	var c Config
	for i := range Settings {
		if s := &Settings[i]; s.Field != "" {
			f := s.field(&c)
			f.Set(s.defaultValue(role, f.Type()))
		}
	}
	return c
}

// TestEveryFieldHasOneRow checks that each setting field of Config is
// filled by exactly one row. Role is the program, and Temporal.Profile
// the SDK's (TEMPORAL_PROFILE).
func TestEveryFieldHasOneRow(t *testing.T) {
	t.Parallel()
	rows := map[string]int{}
	for i := range Settings {
		if f := Settings[i].Field; f != "" {
			rows[f]++
		}
	}
	var walk func(prefix string, t reflect.Type)
	var leaves []string
	walk = func(prefix string, typ reflect.Type) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			switch {
			case !f.IsExported():
			case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[Config]():
				walk(prefix+f.Name+".", f.Type)
			default:
				leaves = append(leaves, prefix+f.Name)
			}
		}
	}
	walk("", reflect.TypeFor[Config]())
	for _, leaf := range leaves {
		if leaf == "Role" || leaf == "Temporal.Profile" {
			continue
		}
		require.Equal(t, 1, rows[leaf], "Config.%s is filled by one row of Settings", leaf)
	}
	require.Len(t, rows, len(leaves)-2, "every row's field is a setting field")
}

// TestEveryProgramReadsItsRows sets each row's variable, for each program
// that reads it, to a value of the wrong shape, and checks that the
// program read it: Load names the variable with what is wrong with the
// value (not "required"), or the field holds the value.
func TestEveryProgramReadsItsRows(t *testing.T) {
	t.Parallel()
	const bad = "not valid"
	for i := range Settings {
		s := &Settings[i]
		if s.Field == "" {
			continue
		}
		for _, p := range programsOf(s.For) {
			l := p.loader(map[string]string{s.Env: " " + bad + " ", "TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml"})
			_, err := l.Load()
			var problem string
			if cerr, ok := err.(*Error); ok {
				for _, pr := range cerr.Problems {
					if strings.HasPrefix(pr, s.Env+":") || strings.HasPrefix(pr, s.Env+" (") {
						problem = pr
					}
				}
			}
			if problem != "" {
				require.NotContains(t, problem, "required", "%s for %s: its value is judged", s.Env, p.use)
				continue
			}
			f := s.field(&l.cfg)
			require.Equal(t, reflect.String, f.Kind(), "%s for %s: a value of the wrong shape is a problem", s.Env, p.use)
			require.Equal(t, bad, f.String(), "%s for %s", s.Env, p.use)
		}
	}
}

// TestFlagsFollowTheTable checks each program's configuration flags: one
// for each row it reads that has one, with the row's help, defaulting to
// the environment; none when its group is omitted.
func TestFlagsFollowTheTable(t *testing.T) {
	t.Parallel()
	for _, p := range programsOf(^Uses(0)) {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		l := p.loader(nil)
		l.BindFlags(fs)
		want := map[string]bool{}
		for i := range Settings {
			if s := &Settings[i]; s.Flag != "" && s.For&l.uses != 0 {
				want[s.Flag] = true
				f := fs.Lookup(s.Flag)
				require.NotNil(t, f, "%s has --%s", p.use, s.Flag)
				require.Equal(t, s.Help+" (env "+s.Env+")", f.Usage)
			}
		}
		fs.VisitAll(func(f *flag.Flag) { require.True(t, want[f.Name], "%s: --%s is not one of its rows", p.use, f.Name) })

		omitted := flag.NewFlagSet("x", flag.ContinueOnError)
		l = p.loader(nil)
		l.Omit(TemporalFlags, MigrateFlag)
		l.BindFlags(omitted)
		omitted.VisitAll(func(f *flag.Flag) {
			for i := range Settings {
				require.False(t, Settings[i].Flag == f.Name && Settings[i].Group != 0, "%s: --%s of an omitted group", p.use, f.Name)
			}
		})
	}
}

// TestUsageListsTheRows checks that Usage writes one entry per row the
// programs read, marks the required ones and each secret.
func TestUsageListsTheRows(t *testing.T) {
	t.Parallel()
	for _, p := range programsOf(^Uses(0)) {
		var b strings.Builder
		Usage(&b, p.role, p.use)
		entries := regexp.MustCompile(`(?m)^  ([A-Z][A-Z0-9_*]+)( |$)`).FindAllStringSubmatch(b.String(), -1)
		var got []string
		for _, e := range entries {
			got = append(got, e[1])
		}
		var want []string
		for i := range Settings {
			if s := &Settings[i]; s.For&p.use != 0 {
				want = append(want, s.Env)
				if s.Required&p.use != 0 {
					require.Contains(t, b.String(), "required: "+s.help(), s.Env)
				}
			}
		}
		require.Equal(t, want, got, "%s", p.use)
	}
}

// TestSecretsNeverShow sets every secret field to a sentinel and checks
// that no rendering of the configuration or of the part that holds the
// secret shows it.
func TestSecretsNeverShow(t *testing.T) {
	t.Parallel()
	const sentinel = "SENTINEL0123456789"
	for _, p := range programsOf(^Uses(0)) {
		l := p.loader(nil)
		l.readEnv()
		c := l.cfg
		var parts []any
		for i := range Settings {
			s := &Settings[i]
			if !s.Secret || s.Field == "" || s.For&l.uses == 0 {
				continue
			}
			f := s.field(&c)
			if f.Type() == reflect.TypeFor[Secret]() {
				f.SetString("sk_live_" + sentinel)
			} else {
				f.SetString("postgres://user:" + sentinel + "@db.internal:5432/keyed")
			}
			parts = append(parts, reflect.ValueOf(c).FieldByName(strings.Split(s.Field, ".")[0]).Interface())
		}
		var logs bytes.Buffer
		slog.New(slog.NewJSONHandler(&logs, nil)).Info("config", "config", c)
		shown := []string{c.String(), fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), logs.String()}
		for _, part := range parts {
			shown = append(shown, fmt.Sprint(part), fmt.Sprintf("%+v", part), fmt.Sprintf("%#v", part))
		}
		for _, s := range shown {
			require.NotContains(t, s, sentinel, "%s", p.use)
		}
	}
}

func TestAddressesMustBeHostPort(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"nope", "127.0.0.1:99999", "127.0.0.1:http", "exa mple:80", "-x:80", "a..b:80"} {
		require.Error(t, checkHostPort(bad), bad)
	}
	for _, good := range []string{"127.0.0.1:8080", ":0", "[::1]:7233", "temporal-frontend.prod.svc:7233", "localhost:1", "[fe80::1%eth0]:9464"} {
		require.NoError(t, checkHostPort(good), good)
	}
}

// TestLoaderNamesNoSetting checks that the loader's code knows settings
// only through the table, so that a new one needs no code but its row:
// none of their variables is spelled in it (temporal.go is the Temporal
// SDK's reader, settings.go the table).
func TestLoaderNamesNoSetting(t *testing.T) {
	t.Parallel()
	for _, file := range []string{"loader.go", "value.go", "usage.go", "redact.go", "config.go"} {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		for i := range Settings {
			require.NotContains(t, string(b), `"`+Settings[i].Env+`"`, "%s spells %s: read it through its row", file, Settings[i].Env)
		}
	}
}
