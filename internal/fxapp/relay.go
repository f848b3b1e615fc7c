package fxapp

import "go.uber.org/fx"

// RelayModule runs the outbox relay. It is a placeholder until the outbox
// package is wired in.
var RelayModule = fx.Module("relay")
