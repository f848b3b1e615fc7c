// Package proccpu reads the CPU time processes have used from /proc, for
// benchmarks that price a party's work: this process, another process, or
// every Postgres process of the machine.
package proccpu

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ClockTick is the kernel's USER_HZ, the unit of utime and stime in
// /proc/<pid>/stat; 100 on every Linux this runs on.
const ClockTick = 10 * time.Millisecond

// Of returns the user plus system CPU time of /proc/<pid> ("self" for this
// process), or zero when it cannot be read: the figures are a diagnosis,
// not an assertion.
func Of(pid string) time.Duration {
	raw, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 14th and 15th of the whole line, the 12th and 13th after it.
	_, rest, ok := bytes.Cut(raw, []byte(") "))
	if !ok {
		return 0
	}
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		return 0
	}
	u, uerr := strconv.ParseInt(f[11], 10, 64)
	st, serr := strconv.ParseInt(f[12], 10, 64)
	if uerr != nil || serr != nil {
		return 0
	}
	return time.Duration(u+st) * ClockTick
}

// Postgres returns the CPU time of every process named postgres: the
// backends, and the WAL writer and the other background processes.
func Postgres() time.Duration {
	var sum time.Duration
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0
	}
	for _, d := range dirs {
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err == nil && strings.TrimSpace(string(comm)) == "postgres" {
			sum += Of(filepath.Base(d))
		}
	}
	return sum
}
