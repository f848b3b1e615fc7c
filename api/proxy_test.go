package api_test

import (
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// dbProxy sits between a pool and Postgres. It forwards until told to
// stall (connections stay open and nothing passes, like a dead network
// path; data read during a stall is dropped and its connection closed on
// resume) or to go down (every connection closes, new ones close at once).
type dbProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	mode  proxyMode
	conns map[net.Conn]bool
}

type proxyMode int

const (
	proxyForward proxyMode = iota
	proxyStall
	proxyDown
)

func newDBProxy(t testing.TB, target string) *dbProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &dbProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.cond = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.set(proxyDown)
	})
	return p
}

func (p *dbProxy) addr() string { return p.ln.Addr().String() }

// set switches the mode; down closes every open connection.
func (p *dbProxy) set(m proxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	if m == proxyDown {
		for c := range p.conns {
			_ = c.Close()
		}
	}
	p.cond.Broadcast()
}

func (p *dbProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(client)
	}
}

func (p *dbProxy) handle(client net.Conn) {
	p.mu.Lock()
	down := p.mode == proxyDown
	p.mu.Unlock()
	if down {
		_ = client.Close()
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	p.mu.Lock()
	p.conns[client], p.conns[server] = true, true
	p.mu.Unlock()
	closeBoth := func() {
		_ = client.Close()
		_ = server.Close()
		p.mu.Lock()
		delete(p.conns, client)
		delete(p.conns, server)
		p.mu.Unlock()
	}
	go p.pump(server, client, closeBoth)
	p.pump(client, server, closeBoth)
}

// pump copies from src to dst until either ends, holding back whatever
// arrives during a stall.
func (p *dbProxy) pump(src, dst net.Conn, closeBoth func()) {
	defer closeBoth()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.pass() {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pass waits out a stall and reports whether data may pass: false when the
// proxy stalled (the data is dropped) or is down.
func (p *dbProxy) pass() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	stalled := false
	for p.mode == proxyStall {
		stalled = true
		p.cond.Wait()
	}
	return !stalled && p.mode == proxyForward
}
