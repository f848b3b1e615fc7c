package api

import (
	"context"
	"sync"
)

// gates queues this process's requests of one key (an order's refund
// requests) before they take a pooled connection. The database lock behind
// them runs them one at a time anyway; queued here, the waiting ones hold
// no connection that another tenant's request could use. The zero value is
// ready for use.
type gates struct {
	mu sync.Mutex
	m  map[string]*gate
}

// gate is one key's turn: a token in a channel of one, and how many
// requests hold or wait for it (the gate is dropped at zero).
type gate struct {
	turn  chan struct{}
	users int
}

// enter waits for key's turn, or for ctx to end (its error). The returned
// func ends the turn; call it once.
func (g *gates) enter(ctx context.Context, key string) (func(), error) {
	g.mu.Lock()
	e := g.m[key]
	if e == nil {
		if g.m == nil {
			g.m = map[string]*gate{}
		}
		e = &gate{turn: make(chan struct{}, 1)}
		g.m[key] = e
	}
	e.users++
	g.mu.Unlock()
	select {
	case e.turn <- struct{}{}:
		return func() { <-e.turn; g.leave(key, e) }, nil
	case <-ctx.Done():
		g.leave(key, e)
		return nil, ctx.Err()
	}
}

// leave counts one user of key's gate out, and drops the gate at zero.
func (g *gates) leave(key string, e *gate) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.users--; e.users == 0 {
		delete(g.m, key)
	}
}

// size returns how many keys have a gate (for tests).
func (g *gates) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.m)
}
