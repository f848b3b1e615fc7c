package fxapp

import "go.uber.org/fx"

// APIModule serves keyed's HTTP API. It is a placeholder until the api
// package is wired in.
var APIModule = fx.Module("api")
