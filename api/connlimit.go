package api

import (
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
// connection first closes the connection idle longest between requests;
// with none idle, Accept waits for one to close (a connection that is
// reading or writing ends within the server's timeouts). Meanwhile the
// connections after it wait in the kernel's backlog, without a file
// descriptor.
type connLimiter struct {
	net.Listener
	slots   chan struct{}
	done    chan struct{}
	closed  sync.Once
	logger  *slog.Logger
	metrics *Metrics

	mu       sync.Mutex
	idle     map[*limitedConn]time.Time
	lastWarn time.Time
}

func newConnLimiter(ln net.Listener, max int, logger *slog.Logger, metrics *Metrics) *connLimiter {
	metrics.connCap(max)
	return &connLimiter{Listener: ln, slots: make(chan struct{}, max), done: make(chan struct{}),
		logger: logger, metrics: metrics, idle: map[*limitedConn]time.Time{}}
}

// Accept accepts a connection and takes a slot for it, closing the
// longest-idle connection if none is free, or waiting for one to close.
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
	select {
	case l.slots <- struct{}{}:
		return nil
	default:
	}
	l.full()
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-l.done:
		return net.ErrClosed
	}
}

// full closes the connection idle longest, if any, and warns at most once
// a minute that the cap was reached.
func (l *connLimiter) full() {
	l.mu.Lock()
	var oldest *limitedConn
	for c, since := range l.idle {
		if oldest == nil || since.Before(l.idle[oldest]) {
			oldest = c
		}
	}
	delete(l.idle, oldest)
	warn := time.Since(l.lastWarn) > time.Minute
	if warn {
		l.lastWarn = time.Now()
	}
	l.mu.Unlock()
	if warn {
		l.logger.Warn("api connection cap reached: closing idle connections, new ones wait",
			"max_connections", cap(l.slots))
	}
	if oldest != nil {
		l.metrics.idleClosed()
		if err := oldest.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			l.logger.Debug("close idle connection", "error", err)
		}
	}
}

// state is the http.Server's ConnState hook: it keeps the set of
// connections idle between requests.
func (l *connLimiter) state(c net.Conn, s http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s == http.StateIdle {
		l.idle[lc] = time.Now()
		return
	}
	delete(l.idle, lc)
}

// open returns how many connections hold a slot.
func (l *connLimiter) open() int { return len(l.slots) }

func (l *connLimiter) Close() error {
	l.closed.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitedConn gives its slot back once, when it is closed.
type limitedConn struct {
	net.Conn
	l    *connLimiter
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.idle, c)
		c.l.mu.Unlock()
		<-c.l.slots
		c.l.metrics.connOpened(-1)
	})
	return err
}
