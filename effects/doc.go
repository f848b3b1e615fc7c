// Package effects makes a side effect happen once, however many times the
// code around it runs: a step claims an effect key in Postgres before acting
// and stores the outcome under it after, so a second run returns the stored
// outcome instead of acting. Do and DoTx wrap a function in that claim; a
// Migrator creates the table; Prune and PruneKind keep it small.
//
// Effect classes, keys, claim states, migrations and retention are described
// in docs/design.md ("Notes moved from the code", effects).
package effects
