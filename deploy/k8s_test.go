package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
)

// kustomizations are the directories a user applies with kubectl -k.
var kustomizations = []string{"k8s/base", "k8s/overlays/cloud"}

// bundle is one built kustomization, every object decoded into its type.
type bundle struct {
	dir         string
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	pdbs        map[string]*policyv1.PodDisruptionBudget
	hpas        map[string]*autoscalingv2.HorizontalPodAutoscaler
	jobs        map[string]*batchv1.Job
	cronJobs    map[string]*batchv1.CronJob
	monitors    map[string]*serviceMonitor
	rules       map[string]*prometheusRule
}

// ServiceMonitor and PrometheusRule (monitoring.coreos.com/v1) are CRDs with
// no type in k8s.io/api: these structs hold the fields keyed uses, and the
// strict decode rejects any other.
type serviceMonitor struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type prometheusRule struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       ruleGroups `json:"spec"`
}

type objectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// ruleGroups is a Prometheus rule file, and a PrometheusRule's spec.
type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// build runs kustomize (the krusty API kubectl embeds) on dir as found on
// disk and decodes every object strictly: an unknown or misspelled field,
// or a kind keyed does not expect, fails the test.
func build(t *testing.T, dir string) *bundle {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err, "kustomize build %s", dir)
	b := &bundle{dir: dir, deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		hpas: map[string]*autoscalingv2.HorizontalPodAutoscaler{}, jobs: map[string]*batchv1.Job{},
		cronJobs: map[string]*batchv1.CronJob{}, monitors: map[string]*serviceMonitor{}, rules: map[string]*prometheusRule{}}
	for _, r := range m.Resources() {
		raw, err := r.MarshalJSON()
		require.NoError(t, err)
		gvk := r.GetApiVersion() + " " + r.GetKind()
		name := r.GetName()
		var dst any
		switch gvk {
		case "apps/v1 Deployment":
			dst = put(b.deployments, name)
		case "v1 Service":
			dst = put(b.services, name)
		case "v1 ConfigMap":
			dst = put(b.configMaps, name)
		case "policy/v1 PodDisruptionBudget":
			dst = put(b.pdbs, name)
		case "autoscaling/v2 HorizontalPodAutoscaler":
			dst = put(b.hpas, name)
		case "batch/v1 Job":
			dst = put(b.jobs, name)
		case "batch/v1 CronJob":
			dst = put(b.cronJobs, name)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			dst = put(b.monitors, name)
		case "monitoring.coreos.com/v1 PrometheusRule":
			dst = put(b.rules, name)
		default:
			t.Fatalf("%s: unexpected object %s %s", dir, gvk, name)
		}
		require.NoError(t, decodeStrict(raw, dst), "%s: %s %s", dir, gvk, name)
	}
	return b
}

func put[T any](m map[string]*T, name string) *T {
	v := new(T)
	m[name] = v
	return v
}

func decodeStrict(raw []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the object")
	}
	return nil
}

// TestKustomizationsBuildStrictly builds the base and every overlay and
// checks that each holds what a deployment needs.
func TestKustomizationsBuildStrictly(t *testing.T) {
	t.Parallel()
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			t.Parallel()
			b := build(t, dir)
			for _, name := range []string{"keyed-worker", "keyed-api"} {
				require.Contains(t, b.deployments, name)
				require.Contains(t, b.services, name)
				require.Contains(t, b.pdbs, name)
			}
			require.Contains(t, b.hpas, "keyed-worker")
			require.Contains(t, b.jobs, "keyed-migrate")
			require.Empty(t, b.cronJobs, "the worker reconciles on its own schedule (RECONCILE_EVERY)")
			require.Len(t, b.monitors, 1)
			require.Len(t, b.rules, 1)
			require.Len(t, b.configMaps, 1, "one generated ConfigMap of shared settings")
			if dir == "k8s/base" {
				require.Contains(t, b.jobs, "keyed-search-attributes")
			} else {
				require.NotContains(t, b.jobs, "keyed-search-attributes", "Temporal Cloud registers search attributes with tcld or Terraform")
			}
			checkReferences(t, b)
		})
	}
}

// checkReferences checks that every ConfigMap the pods name is in the
// bundle, that secrets come only from Secrets, and that selectors match.
func checkReferences(t *testing.T, b *bundle) {
	t.Helper()
	for _, p := range b.pods() {
		for _, c := range p.spec.Containers {
			for _, ef := range c.EnvFrom {
				require.Nil(t, ef.SecretRef, "%s: secrets are referenced by key, not imported whole", p.name)
				require.NotNil(t, ef.ConfigMapRef, p.name)
				require.Contains(t, b.configMaps, ef.ConfigMapRef.Name, "%s names a ConfigMap the kustomization generates", p.name)
			}
			for _, e := range c.Env {
				if secretLike(e.Name) {
					require.Empty(t, e.Value, "%s: %s must come from a Secret, not a literal", p.name, e.Name)
					require.NotNil(t, e.ValueFrom, "%s: %s", p.name, e.Name)
					require.NotNil(t, e.ValueFrom.SecretKeyRef, "%s: %s comes from a Secret", p.name, e.Name)
				}
			}
		}
	}
	for _, cm := range b.configMaps {
		for k := range cm.Data {
			require.False(t, secretLike(k), "ConfigMap %s holds %s, a secret", cm.Name, k)
		}
	}
	for name, s := range b.services {
		d := b.deployments[name]
		require.NotNil(t, d, "Service %s fronts the Deployment of the same name", name)
		for k, v := range s.Spec.Selector {
			require.Equal(t, v, d.Spec.Template.Labels[k], "Service %s selects the pods of %s", name, name)
		}
		require.Equal(t, d.Spec.Selector.MatchLabels, b.pdbs[name].Spec.Selector.MatchLabels, "PodDisruptionBudget %s", name)
	}
	for name, sm := range b.monitors {
		for _, ep := range sm.Spec.Endpoints {
			selected := 0
			for _, s := range b.services {
				if !matches(sm.Spec.Selector.MatchLabels, s.Labels) {
					continue
				}
				selected++
				require.True(t, slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }),
					"ServiceMonitor %s scrapes port %q, which Service %s lacks", name, ep.Port, s.Name)
			}
			require.Equal(t, 2, selected, "ServiceMonitor %s selects the worker and API Services", name)
		}
	}
	require.Equal(t, "Deployment", b.hpas["keyed-worker"].Spec.ScaleTargetRef.Kind)
	require.Equal(t, "keyed-worker", b.hpas["keyed-worker"].Spec.ScaleTargetRef.Name)
}

func matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func secretLike(name string) bool {
	for _, s := range []string{"DATABASE_URL", "STRIPE_SECRET_KEY", "SENDGRID_API_KEY", "KEYED_API_KEYS", "TEMPORAL_API_KEY"} {
		if strings.EqualFold(name, s) {
			return true
		}
	}
	return false
}

// pod is one pod template in a bundle, by workload.
type pod struct {
	name string
	spec *corev1.PodSpec
}

func (b *bundle) pods() []pod {
	var out []pod
	for n, d := range b.deployments {
		out = append(out, pod{"Deployment " + n, &d.Spec.Template.Spec})
	}
	for n, j := range b.jobs {
		out = append(out, pod{"Job " + n, &j.Spec.Template.Spec})
	}
	for n, c := range b.cronJobs {
		out = append(out, pod{"CronJob " + n, &c.Spec.JobTemplate.Spec.Template.Spec})
	}
	slices.SortFunc(out, func(a, b pod) int { return strings.Compare(a.name, b.name) })
	return out
}

func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// TestWorkerDeployment checks the worker's probes, drain and resources.
func TestWorkerDeployment(t *testing.T) {
	t.Parallel()
	for _, dir := range kustomizations {
		b := build(t, dir)
		d := b.deployments["keyed-worker"]
		require.NotNil(t, d, dir)
		spec := d.Spec.Template.Spec
		require.Len(t, spec.Containers, 1)
		c := spec.Containers[0]

		stop, ok := envValue(c, "WORKER_STOP_TIMEOUT")
		require.True(t, ok, "%s: the worker sets WORKER_STOP_TIMEOUT", dir)
		stopTimeout, err := time.ParseDuration(stop)
		require.NoError(t, err)
		require.NotNil(t, spec.TerminationGracePeriodSeconds)
		grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
		// fxapp.Worker gives the stop hooks WORKER_STOP_TIMEOUT + 15s.
		require.Greater(t, grace, stopTimeout+15*time.Second,
			"%s: terminationGracePeriodSeconds (%s) must outlast the worker's drain (%s + 15s)", dir, grace, stopTimeout)

		addr, _ := envValue(c, "METRICS_ADDR")
		require.True(t, strings.HasPrefix(addr, "0.0.0.0:"), "%s: METRICS_ADDR listens on every interface, got %q", dir, addr)
		require.Len(t, c.Ports, 1)
		require.Equal(t, strings.TrimPrefix(addr, "0.0.0.0:"), fmt.Sprint(c.Ports[0].ContainerPort))

		require.NotNil(t, c.ReadinessProbe)
		require.Equal(t, "/healthz", c.ReadinessProbe.HTTPGet.Path, "%s: readiness follows /healthz (Postgres and Temporal)", dir)
		require.NotNil(t, c.LivenessProbe)
		if c.LivenessProbe.HTTPGet != nil {
			require.NotEqual(t, "/healthz", c.LivenessProbe.HTTPGet.Path, "%s: liveness must not restart workers on a Postgres blip", dir)
		}
		require.GreaterOrEqual(t, time.Duration(c.LivenessProbe.PeriodSeconds*c.LivenessProbe.FailureThreshold)*time.Second, time.Minute,
			"%s: liveness tolerates a minute of trouble", dir)
		require.NotNil(t, c.StartupProbe, "%s: a startup probe covers migrations", dir)

		require.False(t, c.Resources.Requests.Cpu().IsZero(), "%s: CPU request (the HPA needs it)", dir)
		require.False(t, c.Resources.Requests.Memory().IsZero(), dir)
		require.False(t, c.Resources.Limits.Memory().IsZero(), dir)
		require.Equal(t, 1, b.pdbs["keyed-worker"].Spec.MaxUnavailable.IntValue())
		require.GreaterOrEqual(t, *b.hpas["keyed-worker"].Spec.MinReplicas, int32(2))
	}
}

// TestImagesAndCommands checks that every container runs an image
// deploy/Dockerfile builds (or the Temporal tools image the compose file
// uses) and a binary the image carries, and that every starter command
// and flag in the manifests exists: it asks the starter built from
// cmd/starter.
func TestImagesAndCommands(t *testing.T) {
	t.Parallel()
	bins := dockerfileBinaries(t)
	adminTools := composeImage(t, "temporal-search-attributes")
	starter := filepath.Join(t.TempDir(), "starter")
	out, err := exec.Command("go", "build", "-o", starter, "../cmd/starter").CombinedOutput()
	require.NoError(t, err, "go build ./cmd/starter: %s", out)
	help, err := exec.Command(starter, "help").Output()
	require.NoError(t, err)

	for _, dir := range kustomizations {
		b := build(t, dir)
		for _, p := range b.pods() {
			for _, c := range p.spec.Containers {
				if strings.HasPrefix(c.Image, "temporalio/") {
					require.Equal(t, adminTools, c.Image, "%s %s: the same Temporal tools image as the compose file", dir, p.name)
					continue
				}
				repo, _, _ := strings.Cut(c.Image, ":")
				require.Equal(t, "keyed", filepath.Base(repo), "%s %s: image %s is keyed's (deploy/Dockerfile)", dir, p.name, c.Image)
				require.Len(t, c.Command, 1, "%s %s: command is one binary", dir, p.name)
				require.Contains(t, bins, c.Command[0], "%s %s: deploy/Dockerfile's production image carries %s", dir, p.name, c.Command[0])
				if filepath.Base(c.Command[0]) == "starter" {
					checkStarterArgs(t, starter, string(help), c.Args, dir+" "+p.name)
				}
			}
		}
	}
}

func checkStarterArgs(t *testing.T, starter, help string, args []string, where string) {
	t.Helper()
	require.NotEmpty(t, args, where)
	cmd := args[0]
	require.Regexp(t, `(?m)^  `+regexp.QuoteMeta(cmd)+` `, help, "%s: `starter help` lists %q", where, cmd)
	usage, err := exec.Command(starter, cmd, "-h").Output()
	require.NoError(t, err, "%s: starter %s -h", where, cmd)
	for _, a := range args[1:] {
		if name, ok := strings.CutPrefix(a, "-"); ok {
			name = strings.TrimPrefix(name, "-")
			name, _, _ = strings.Cut(name, "=")
			require.Regexp(t, `(?m)^\s+--?`+regexp.QuoteMeta(name)+`\b`, string(usage), "%s: starter %s has flag -%s", where, cmd, name)
		}
	}
}

// dockerfileBinaries returns the paths the production image (the
// Dockerfile's last stage) copies binaries to.
func dockerfileBinaries(t *testing.T) []string {
	t.Helper()
	df, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	stages := regexp.MustCompile(`(?m)^FROM `).Split(string(df), -1)
	last := stages[len(stages)-1]
	var bins []string
	for _, m := range regexp.MustCompile(`(?m)^COPY --from=\S+ (.+) (/usr/local/bin/)$`).FindAllStringSubmatch(last, -1) {
		for _, src := range strings.Fields(m[1]) {
			bins = append(bins, m[2]+filepath.Base(src))
		}
	}
	require.NotEmpty(t, bins, "the Dockerfile's last stage copies binaries to /usr/local/bin/")
	return bins
}

// secretStandIns returns a value for each secret setting a manifest may
// take from a Secret: its row's example, or one written here for the
// secrets without one, so that a provider's new key needs no line here.
func secretStandIns() map[string]string {
	standIns := map[string]string{"DATABASE_URL": "postgres://keyed@db.internal:5432/keyed?sslmode=require",
		"KEYED_API_KEYS": "acme=sk_keyed_standin", "TEMPORAL_API_KEY": "standin-temporal-api-key"}
	for _, s := range config.Settings {
		if _, written := standIns[s.Env]; s.Secret && s.Example != "" && !written {
			standIns[s.Env] = s.Example
		}
	}
	return standIns
}

// TestManifestConfigurationLoads loads each keyed container's environment
// (its literals and the generated ConfigMap, with stand-ins for the
// Secrets) through keyed's own configuration loader, so that a bad
// duration, address or sender in a manifest fails here, not at rollout.
func TestManifestConfigurationLoads(t *testing.T) {
	t.Parallel()
	standIns := secretStandIns()
	for _, dir := range kustomizations {
		b := build(t, dir)
		for _, p := range b.pods() {
			c := p.spec.Containers[0]
			if len(c.Command) == 0 {
				continue // the Temporal tools image
			}
			env := map[string]string{}
			for _, ef := range c.EnvFrom {
				for k, v := range b.configMaps[ef.ConfigMapRef.Name].Data {
					env[k] = v
				}
			}
			for _, e := range c.Env {
				switch {
				case e.ValueFrom == nil:
					env[e.Name] = e.Value
				case e.ValueFrom.SecretKeyRef != nil:
					require.Contains(t, standIns, e.Name, "%s %s: a stand-in for secret %s", dir, p.name, e.Name)
					env[e.Name] = standIns[e.Name]
				}
			}
			secretFileStandIns(t, p.spec, c, env)
			role := config.Starter
			if filepath.Base(c.Command[0]) == "worker" {
				role = config.Worker
			}
			l := config.NewLoader(role, fxapptest.Lookup(env))
			if role == config.Starter && len(c.Args) > 0 {
				l.Command(c.Args[0]) // its own settings too: serve's API, reconcile's Stripe key
			}
			_, err := l.Load()
			require.NoError(t, err, "%s %s", dir, p.name)
		}
	}
}
