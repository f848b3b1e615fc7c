package tempcluster

import (
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// proxy is the cluster's load balancer: a TCP proxy that hands each new
// connection to the next frontend that accepts it, round robin, as a cloud
// load balancer in front of the frontends does. A connection to a node
// that dies breaks, and the client's redial lands on a live node.
type proxy struct {
	l        net.Listener
	backends []string

	mu    sync.Mutex
	next  int
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newProxy(ip string, port int, backends []string) (*proxy, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	p := &proxy{l: l, backends: backends, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Go(func() { p.handle(c) })
	}
}

// handle pipes c to the first backend, from the next in turn, that accepts.
func (p *proxy) handle(c net.Conn) {
	p.mu.Lock()
	start := p.next
	p.next = (p.next + 1) % len(p.backends)
	p.mu.Unlock()
	for i := range p.backends {
		b, err := net.DialTimeout("tcp", p.backends[(start+i)%len(p.backends)], 2*time.Second)
		if err != nil {
			continue
		}
		if !p.track(c, b) {
			return
		}
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(b, c); done <- struct{}{} }()
		go func() { _, _ = io.Copy(c, b); done <- struct{}{} }()
		<-done
		p.untrack(c, b)
		return
	}
	_ = c.Close()
}

// track records an open pair, or closes it and returns false once closed.
func (p *proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// close stops accepting, closes every open connection and waits.
func (p *proxy) close() {
	_ = p.l.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
