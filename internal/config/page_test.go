package config

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite ../../docs/configuration.md from Settings")

const pagePath = "../../docs/configuration.md"

const pageHead = `# Configuration

<!-- Generated from internal/config/settings.go by
     go test ./internal/config -run TestConfigurationPage -update
     (or go generate ./internal/config). Edit the table there, not this page. -->

keyed's programs read environment variables; the flags shown override the
ones that are not secret (` + "`worker -h`, `starter COMMAND -h`" + `, each listing only
the flags it uses, spelled ` + "`--flag`" + `). A blank variable counts as unset.
Secrets come from the environment only, never from a flag, and every log
line and message shows them redacted (the worker logs its whole
configuration on start, secrets redacted).

Bad or missing configuration gives one message that lists every problem,
sorted, each naming the variable and the flag that overrides it, and exit
status 2; never a panic. For ` + "`starter serve`" + ` that includes the API key list,
for ` + "`starter reconcile`" + ` the Stripe settings. What can only be judged on
start is bad configuration too, and exits 2 with its own message: a
` + "`pool_max_conns`" + ` in ` + "`DATABASE_URL`" + ` below what the process needs, an
` + "`EFFECTS_RETENTION`" + ` shorter than the namespace's retention plus the longest
run, or a ` + "`search_path`" + ` in ` + "`DATABASE_URL`" + ` that names no existing schema.
No message holds a secret: not the keys (Temporal's API key and client
key included; an unreadable or malformed TLS file is named, never quoted),
not the password of ` + "`DATABASE_URL`" + `, not the credentials of a URL such as
` + "`STRIPE_API_BASE=https://user:pass@…`" + ` (refused).

A variable that is no setting but looks like one misspelled is bad
configuration too, so that a typo does not run with the default: one at
most two edits (a letter added, left out or changed, two swapped) from a
setting's name, whose first word is the setting's or one edit from it, as
` + "`WORKER_MAX_ACTIVITES`, `MIGRATE_ON_STRAT` or `RECIEPT_POLICY`" + `. The message
names it and the setting it probably stands for, never its value: rename or
unset it, or, when another program in a shared environment reads it (a
platform's ` + "`DATABASE_URI`" + `), list it in ` + "`KEYED_NOT_SETTINGS`" + `. Every
program checks every setting's name, including those it does not read, so
a shared environment is checked whole. Other programs'
variables (` + "`PATH`, `HOME`, `PG*`, `GO*`" + `) and the families ` + "`OTEL_*`" + ` and
` + "`TEMPORAL_GRPC_META_*`" + ` are never taken for one.

`

const pageTail = `
The Temporal connection is configured the Temporal SDK's way
(` + "`contrib/envconfig`" + `): the ` + "`TEMPORAL_*`" + ` variables over an optional TOML config
file's profile, and keyed's flags over the variables. For Temporal Cloud set
` + "`TEMPORAL_ADDRESS`" + ` and ` + "`TEMPORAL_NAMESPACE`" + ` (` + "`<namespace>.<account>`" + `) and either
the two ` + "`TEMPORAL_TLS_CLIENT_*_PATH`" + ` files (mTLS) or ` + "`TEMPORAL_API_KEY`" + `:
deploy/README.md, "Connecting to Temporal Cloud", has the exact values and
the Kubernetes Secrets. The worker's startup log shows ` + "`temporal_tls`" + ` (` + "`off`" + `,
` + "`tls`" + ` or ` + "`mtls`" + `) and the API key redacted.

A new setting is one row in internal/config/settings.go and its field in
Config: see the package documentation of internal/config, "Adding a
setting".
`

// page renders docs/configuration.md from Settings.
func page() string {
	var b strings.Builder
	b.WriteString(pageHead)
	b.WriteString("| variable | flag | used by | default | meaning |\n| --- | --- | --- | --- | --- |\n")
	for i := range Settings {
		s := &Settings[i]
		doc := s.Doc
		if doc == "" {
			doc = s.help()
		}
		b.WriteString("| `" + s.Env + "` | " + s.flagDoc() + " | " + usesDoc(s.For) + " | " + s.defaultDoc() + " | " + doc + " |\n")
	}
	b.WriteString(pageTail)
	return b.String()
}

func (s *Setting) flagDoc() string {
	switch {
	case s.Flag != "":
		return "`--" + s.Flag + "`"
	case s.Secret:
		return "none: a secret"
	}
	return "—"
}

// usesDoc names the programs of u, starter commands in code.
func usesDoc(u Uses) string {
	var names []string
	for _, p := range programs {
		if u&p.use == 0 {
			continue
		}
		if p.command != "" {
			names = append(names, "`"+p.name+"`")
		} else {
			names = append(names, p.name)
		}
	}
	return strings.Join(names, ", ")
}

func (s *Setting) defaultDoc() string {
	code := func(v string) string { return "`" + v + "`" }
	var parts []string
	if s.Required != 0 {
		parts = append(parts, "required for "+usesDoc(s.Required)+", such as "+code(s.Example))
	}
	if br, ok := s.Default.(ByRole); ok && s.DefaultDoc == "" {
		parts = append(parts, "worker "+code(show(br.Worker))+", starter "+code(show(br.Starter)))
	} else if d := s.defaultText(Worker, code); d != "" {
		parts = append(parts, d)
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, "; ")
}

// TestConfigurationPage checks that docs/configuration.md is what Settings
// renders; -update rewrites it.
func TestConfigurationPage(t *testing.T) {
	want := page()
	if *update {
		require.NoError(t, os.MkdirAll("../../docs", 0o755))
		require.NoError(t, os.WriteFile(pagePath, []byte(want), 0o644))
	}
	got, err := os.ReadFile(pagePath)
	require.NoError(t, err, "run go test ./internal/config -run TestConfigurationPage -update")
	require.Equal(t, want, string(got), "docs/configuration.md differs from Settings: run go test ./internal/config -run TestConfigurationPage -update")
	for i := range Settings {
		require.Contains(t, string(got), "| `"+Settings[i].Env+"` |")
	}
}

// settingName is a backquoted name that looks like a variable.
var settingName = regexp.MustCompile("`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(?:=[^`]*)?`")

// TestREADMEsLeaveSettingsToThePage checks the manuals that mention
// settings against Settings: each links docs/configuration.md; a table of
// variables there lists only variables another reader takes (keyed's own
// are on the page, generated); and a name spelled like a setting's family
// (its first two words) is a setting.
func TestREADMEsLeaveSettingsToThePage(t *testing.T) {
	t.Parallel()
	families := map[string]bool{}
	for i := range Settings {
		families[family(Settings[i].Env)] = true
	}
	for _, path := range manuals(t) {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		md := string(b)
		require.True(t, path == "../../api/README.md" || strings.Contains(md, "configuration.md"), "%s links the configuration page", path)
		variables := false // inside a table whose header is "variable"
		for _, line := range strings.Split(md, "\n") {
			first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
			switch {
			case !strings.HasPrefix(line, "|"):
				variables = false
			case strings.EqualFold(strings.TrimSpace(first), "variable"):
				variables = true
			}
			for _, n := range settingName.FindAllStringSubmatch(line, -1) {
				s := settingNamed(n[1])
				require.True(t, s != nil || !families[family(n[1])], "%s names %s, which is not in Settings", path, n[1])
				require.False(t, variables && s != nil && s.Field != "" && strings.Contains(first, n[0]),
					"%s: a table of variables lists %s: keyed's own settings are listed in docs/configuration.md only", path, n[1])
			}
		}
	}
}

// manuals returns the README, the package manuals and every page under
// docs/ but the generated one that names a setting.
func manuals(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	out := []string{"../../README.md", "../../deploy/README.md", "../../api/README.md"}
	for _, p := range pages {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		if filepath.Clean(p) != filepath.Clean(pagePath) && settingName.Match(b) {
			out = append(out, p)
		}
	}
	return out
}

// family returns the first two words of a variable's name.
func family(name string) string {
	words := strings.SplitN(name, "_", 3)
	return strings.Join(words[:min(2, len(words))], "_")
}

// settingNamed returns the row of the variable name, or of the family
// (a row ending in "*") it belongs to, or nil.
func settingNamed(name string) *Setting {
	for i := range Settings {
		s := &Settings[i]
		if s.Env == name || strings.HasSuffix(s.Env, "*") && strings.HasPrefix(name, strings.TrimSuffix(s.Env, "*")) {
			return s
		}
	}
	return nil
}
