package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/fakeproviders"
)

// compose holds the parts of docker-compose.yml the tests check.
type compose struct {
	Services map[string]struct {
		Image string `json:"image"`
		Build *struct {
			Context    string `json:"context"`
			Dockerfile string `json:"dockerfile"`
			Target     string `json:"target"`
		} `json:"build"`
		Ports       []string          `json:"ports"`
		Entrypoint  []string          `json:"entrypoint"`
		Environment map[string]string `json:"environment"`
		Volumes     []string          `json:"volumes"`
	} `json:"services"`
}

func readCompose(t *testing.T) compose {
	t.Helper()
	raw, err := os.ReadFile("docker-compose.yml")
	require.NoError(t, err)
	var c compose
	require.NoError(t, yaml.Unmarshal(raw, &c))
	require.NotEmpty(t, c.Services)
	return c
}

func composeImage(t *testing.T, service string) string {
	t.Helper()
	s, ok := readCompose(t).Services[service]
	require.True(t, ok, "docker-compose.yml has service %s", service)
	return s.Image
}

// TestComposeMatchesTheDemo checks that the compose file runs the Temporal
// server and Web UI versions of the dev server `make demo` runs: those of
// the Temporal CLI the Makefile pins.
func TestComposeMatchesTheDemo(t *testing.T) {
	t.Parallel()
	mk, err := os.ReadFile("../Makefile")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^TEMPORAL_CLI_VERSION\s*:=\s*(\S+)`).FindSubmatch(mk)
	require.NotNil(t, m, "the Makefile pins TEMPORAL_CLI_VERSION")
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/temporalio/cli@"+string(m[1])).Output()
	require.NoError(t, err, "go mod download the Temporal CLI %s (make tools does)", m[1])
	var mod struct{ GoMod string }
	require.NoError(t, json.Unmarshal(out, &mod))
	gomod, err := os.ReadFile(mod.GoMod)
	require.NoError(t, err)
	server := regexp.MustCompile(`go\.temporal\.io/server v(\S+)`).FindSubmatch(gomod)
	ui := regexp.MustCompile(`github\.com/temporalio/ui-server/v2 v(\S+)`).FindSubmatch(gomod)
	require.NotNil(t, server)
	require.NotNil(t, ui)

	c := readCompose(t)
	require.Equal(t, "temporalio/auto-setup:"+string(server[1]), c.Services["temporal"].Image)
	require.Equal(t, "temporalio/ui:"+string(ui[1]), c.Services["temporal-ui"].Image)
	require.True(t, strings.HasPrefix(c.Services["temporal-search-attributes"].Image, "temporalio/admin-tools:"+string(server[1])+"-"),
		"admin-tools of the same server release, got %s", c.Services["temporal-search-attributes"].Image)
}

// TestComposePortsAndImages checks that no published port clashes with a
// local Postgres, dev server, worker or fakes, that keyed's production
// image is built by one service only, and that the fakes have their own.
func TestComposePortsAndImages(t *testing.T) {
	t.Parallel()
	c := readCompose(t)
	taken := map[string]string{"5432": "a local Postgres", "7233": "a Temporal dev server", "8233": "the dev server's Web UI",
		"9464": "a local worker's metrics", "12111": "the local fake Stripe", "12112": "the local fake SendGrid",
		"8080": "a local `starter serve`"}
	builds := map[string][]string{}
	for name, s := range c.Services {
		for _, p := range s.Ports {
			parts := strings.Split(p, ":")
			require.Len(t, parts, 3, "%s: publish %q on 127.0.0.1 only (ip:host:container)", name, p)
			require.Equal(t, "127.0.0.1", parts[0], "%s: %q", name, p)
			why, clash := taken[parts[1]]
			require.False(t, clash, "%s publishes host port %s, which %s uses", name, parts[1], why)
		}
		if s.Build != nil {
			require.Equal(t, "deploy/Dockerfile", s.Build.Dockerfile, name)
			builds[s.Image] = append(builds[s.Image], name)
		}
	}
	require.Equal(t, map[string][]string{"keyed:local": {"worker"}, "keyed-fakes:local": {"fakes"}}, builds,
		"each image is built by one service")
	require.Equal(t, "keyed", c.Services["worker"].Build.Target)
	require.Equal(t, "fakes", c.Services["fakes"].Build.Target)
	for _, name := range []string{"api", "starter"} {
		require.Equal(t, "keyed:local", c.Services[name].Image, name)
		require.Equal(t, []string{"/usr/local/bin/starter"}, c.Services[name].Entrypoint, name)
	}
	require.Contains(t, dockerfileBinaries(t), "/usr/local/bin/starter")
	require.NotContains(t, dockerfileBinaries(t), "/usr/local/bin/fakes", "the production image carries no fakes")
	df, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^FROM \S+ AS fakes$`, string(df))
	require.Regexp(t, `(?m)^FROM \S+ AS keyed$`, string(df))
}

// TestComposeSetsTheRecommendedServerConfig checks that the compose file's
// Temporal server reads temporal-dynamicconfig.yaml, and that the file sets
// every value of the dev server `make demo` runs (devserver.Recommended:
// fairness, fast dispatch) in the server's dynamic config form: a list of
// values, the first unconstrained.
func TestComposeSetsTheRecommendedServerConfig(t *testing.T) {
	t.Parallel()
	temporal := readCompose(t).Services["temporal"]
	path := temporal.Environment["DYNAMIC_CONFIG_FILE_PATH"]
	require.NotEmpty(t, path, "the temporal service sets DYNAMIC_CONFIG_FILE_PATH")
	require.Contains(t, temporal.Volumes, "./temporal-dynamicconfig.yaml:"+path+":ro")
	raw, err := os.ReadFile("temporal-dynamicconfig.yaml")
	require.NoError(t, err)
	var dyn map[string][]struct {
		Value       any            `json:"value"`
		Constraints map[string]any `json:"constraints"`
	}
	require.NoError(t, yaml.UnmarshalStrict(raw, &dyn))
	for k, v := range devserver.Recommended() {
		require.NotEmpty(t, dyn[k], "temporal-dynamicconfig.yaml sets %s", k)
		require.Empty(t, dyn[k][0].Constraints, k)
		require.Equal(t, v, fmt.Sprint(dyn[k][0].Value), k)
	}
}

// TestSearchAttributesMatchTheDevServer checks that the compose job and the
// Kubernetes Job register every search attribute the dev server registers
// for keyed (internal/devserver), with the same type.
func TestSearchAttributesMatchTheDevServer(t *testing.T) {
	t.Parallel()
	want := devserver.SearchAttributes() // Name=Type
	loop := regexp.MustCompile(`for sa in ([A-Za-z= ]+); do`)
	scripts := map[string]string{}
	raw, err := os.ReadFile("docker-compose.yml")
	require.NoError(t, err)
	scripts["docker-compose.yml"] = string(raw)
	raw, err = os.ReadFile("k8s/base/jobs.yaml")
	require.NoError(t, err)
	scripts["k8s/base/jobs.yaml"] = string(raw)
	for file, s := range scripts {
		m := loop.FindStringSubmatch(s)
		require.NotNil(t, m, "%s registers search attributes in a for loop", file)
		require.ElementsMatch(t, want, strings.Fields(m[1]), "%s registers the dev server's search attributes, as Name=Type", file)
		require.Contains(t, s, `--type "`, file)
	}
}

// TestDocumentedSearchAttributes checks the operator's hand-run commands
// against the dev server's list: deploy/README.md's create commands and
// dev server flags name every search attribute keyed's pipelines set, with
// its type, and no command in the READMEs or docs/ names one they do not
// set, or with another type.
func TestDocumentedSearchAttributes(t *testing.T) {
	t.Parallel()
	want := devserver.SearchAttributes() // Name=Type
	create := regexp.MustCompile(`--name (\w+) --type (\w+)`)
	flag := regexp.MustCompile(`--search-attribute (\w+=\w+)`)
	docs, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, docs)
	for _, file := range append(docs, "README.md", "../README.md") {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		var created, flagged []string
		for _, m := range create.FindAllStringSubmatch(string(raw), -1) {
			created = append(created, m[1]+"="+m[2])
		}
		for _, m := range flag.FindAllStringSubmatch(string(raw), -1) {
			flagged = append(flagged, m[1])
		}
		for _, sa := range append(created, flagged...) {
			require.Contains(t, want, sa, "%s registers a search attribute no pipeline sets, or with another type", file)
		}
		if file == "README.md" {
			require.ElementsMatch(t, want, created, "deploy/README.md's commands create every search attribute, as Name=Type")
			require.ElementsMatch(t, want, flagged, "deploy/README.md's dev server flags name every search attribute, as Name=Type")
		}
	}
}

// TestComposeWorkerUsesEveryFake checks that the compose worker reaches
// each provider at its fake in the fakes service (cmd/fakes serves every
// row of internal/fakeproviders' table on its port) unless the shell says
// otherwise, so a provider added with its fake needs one line here.
func TestComposeWorkerUsesEveryFake(t *testing.T) {
	t.Parallel()
	env := readCompose(t).Services["worker"].Environment
	for _, f := range fakeproviders.Fakes {
		require.Equal(t, fmt.Sprintf("${%s:-http://fakes:%d}", f.Base, f.Port), env[f.Base],
			"docker-compose.yml's worker sets %s", f.Base)
	}
}
