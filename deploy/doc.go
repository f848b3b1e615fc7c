// Package deploy holds keyed's deployment artefacts and the tests that
// check them: the Kubernetes manifests under k8s/ (a kustomize base and an
// overlay for Temporal Cloud), the Prometheus rules under prometheus/, the
// Grafana dashboard under grafana/, the Dockerfile and the compose file.
// It has no code of its own; `go test ./deploy/` builds the kustomizations
// and decodes every object strictly into the Kubernetes API types, runs
// promtool's rule tests, and checks that every metric the rules and the
// dashboard name is one keyed exports.
package deploy
