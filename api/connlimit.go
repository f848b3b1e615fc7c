package api

import (
	"container/list"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// MinMaxConns and MaxDefaultConns bound the connection cap
// DefaultMaxConns returns.
const (
	MinMaxConns     = 64
	MaxDefaultConns = 10000
)

// DefaultMaxConns returns the connection cap a zero ServerOpts.MaxConns
// means: three quarters of the process's open-file limit, so that the
// connections to Postgres and Temporal, and the files the process opens,
// keep the last quarter whatever callers do; at least MinMaxConns and at
// most MaxDefaultConns (a container's limit of 1 048 576 files would
// otherwise let callers hold gigabytes of connection buffers).
func DefaultMaxConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > MaxDefaultConns*2 {
		return MaxDefaultConns
	}
	return min(MaxDefaultConns, max(MinMaxConns, int(rl.Cur/4*3)))
}

// connLimiter caps the connections a Server holds open. At the cap, a new
// connection first closes the connection idle longest between requests,
// then, with none idle, the one that has taken longest past its grace to
// send its first request's headers (silent, or sending them a byte at a
// time); with neither, Accept waits for a connection to close, looking
// again every quarter of the grace (a connection that is reading or
// writing a request ends within the server's timeouts). Meanwhile the
// connections after it wait in the kernel's backlog, without a file
// descriptor.
type connLimiter struct {
	net.Listener
	slots   chan struct{}
	done    chan struct{}
	closed  sync.Once
	grace   time.Duration
	logger  *slog.Logger
	metrics *Metrics

	mu       sync.Mutex
	idle     list.List // *limitedConn idle between requests, longest first
	fresh    list.List // *limitedConn reading their first request's headers, oldest first
	lastWarn time.Time
}

// newGrace is how long a new connection may take to send its first
// request's headers before, at the cap, it may be closed: a second, or
// half the header timeout if that is shorter.
func newGrace(readHeaderTimeout time.Duration) time.Duration {
	return min(time.Second, readHeaderTimeout/2)
}

func newConnLimiter(ln net.Listener, max int, grace time.Duration, logger *slog.Logger, metrics *Metrics) *connLimiter {
	metrics.connCap(max)
	return &connLimiter{Listener: ln, slots: make(chan struct{}, max), done: make(chan struct{}),
		grace: grace, logger: logger, metrics: metrics}
}

// Accept accepts a connection and takes a slot for it, closing an idle or
// a slow new connection if none is free, or waiting for one to close.
// Only the connection being accepted is ever held beyond the cap.
func (l *connLimiter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if err := l.acquire(); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	l.metrics.connOpened(1)
	return &limitedConn{Conn: c, l: l}, nil
}

func (l *connLimiter) acquire() error {
	if l.tryAcquire() {
		return nil
	}
	again := time.NewTicker(max(l.grace/4, time.Millisecond))
	defer again.Stop()
	for {
		l.full()
		select {
		case l.slots <- struct{}{}:
			return nil
		case <-l.done:
			return net.ErrClosed
		case <-again.C:
			// A slot freed meanwhile is taken before anything is closed.
			if l.tryAcquire() {
				return nil
			}
		}
	}
}

// tryAcquire takes a free slot, if there is one.
func (l *connLimiter) tryAcquire() bool {
	select {
	case l.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// full closes the connection idle longest or, with none idle, the new
// connection longest past its grace without a request, if any, and warns
// at most once a minute that the cap was reached.
func (l *connLimiter) full() {
	l.mu.Lock()
	var victim *limitedConn
	slow := false
	if e := l.idle.Front(); e != nil {
		victim = e.Value.(*limitedConn)
	} else if e := l.fresh.Front(); e != nil && time.Since(e.Value.(*limitedConn).since) >= l.grace {
		victim, slow = e.Value.(*limitedConn), true
	}
	if victim != nil {
		l.move(victim, nil)
	}
	warn := time.Since(l.lastWarn) > time.Minute
	if warn {
		l.lastWarn = time.Now()
	}
	l.mu.Unlock()
	if warn {
		l.logger.Warn("api connection cap reached: closing idle and slow new connections, new ones wait",
			"max_connections", cap(l.slots))
	}
	if victim == nil {
		return
	}
	if slow {
		l.metrics.slowClosed()
	} else {
		l.metrics.idleClosed()
	}
	if err := victim.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		l.logger.Debug("close connection at the cap", "error", err)
	}
}

// state is the http.Server's ConnState hook: it keeps the connections idle
// between requests and those reading their first request's headers
// (net/http reports a connection active only once it has read a request's
// headers), each in the order they got there.
func (l *connLimiter) state(c net.Conn, s http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch s {
	case http.StateNew:
		l.move(lc, &l.fresh)
	case http.StateIdle:
		l.move(lc, &l.idle)
	default:
		l.move(lc, nil)
	}
}

// move takes c off the list it is on and, unless to is nil, puts it last
// on to, since now. The caller holds l.mu.
func (l *connLimiter) move(c *limitedConn, to *list.List) {
	if c.on != nil {
		c.on.Remove(c.elem)
		c.on, c.elem = nil, nil
	}
	if to != nil {
		c.on, c.elem, c.since = to, to.PushBack(c), time.Now()
	}
}

// open returns how many connections hold a slot.
func (l *connLimiter) open() int { return len(l.slots) }

func (l *connLimiter) Close() error {
	l.closed.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitedConn gives its slot back once, when it is closed. on, elem and
// since, guarded by the limiter's mu, say which of its lists it is on.
type limitedConn struct {
	net.Conn
	l    *connLimiter
	once sync.Once

	on    *list.List
	elem  *list.Element
	since time.Time
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.move(c, nil)
		c.l.mu.Unlock()
		<-c.l.slots
		c.l.metrics.connOpened(-1)
	})
	return err
}
