package tests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/proto"

	"github.com/keyedhq/keyed/internal/proccpu"
)

// cpuSample is the CPU time used so far by the three parties of a
// benchmark: the dev server, every Postgres process, and this process
// (the workers, the clients and the provider fakes).
type cpuSample struct {
	server, postgres, self time.Duration
	// worker is the worker process's, when it runs in a process of its
	// own (sampleCPUOf).
	worker time.Duration
}

// sampleCPU reads the parties' CPU time from /proc. A process that cannot
// be read counts as zero: the figures are a diagnosis, not an assertion.
func sampleCPU() cpuSample { return sampleCPUOf(0) }

// sampleCPUOf is sampleCPU with the worker process workerPID (0: none).
func sampleCPUOf(workerPID int) cpuSample {
	s := cpuSample{server: proccpu.Of(strconv.Itoa(temporalPID)), self: proccpu.Of("self"), postgres: proccpu.Postgres()}
	if workerPID > 0 {
		s.worker = proccpu.Of(strconv.Itoa(workerPID))
	}
	return s
}

// sub returns the CPU each party used between a and b, per run of n.
func (b cpuSample) sub(a cpuSample, n int) cpuSample {
	per := func(d time.Duration) time.Duration { return d / time.Duration(n) }
	return cpuSample{server: per(b.server - a.server), postgres: per(b.postgres - a.postgres), self: per(b.self - a.self),
		worker: per(b.worker - a.worker)}
}

// total is the CPU of all the parties.
func (s cpuSample) total() time.Duration { return s.server + s.postgres + s.self + s.worker }

// String renders a per-run sample in milliseconds.
func (s cpuSample) String() string {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	if s.worker > 0 {
		return fmt.Sprintf("CPU ms/run %.1f: server %.1f, worker %.1f, postgres %.1f, starters+fakes %.1f",
			ms(s.total()), ms(s.server), ms(s.worker), ms(s.postgres), ms(s.self))
	}
	return fmt.Sprintf("CPU ms/run %.1f: server %.1f, postgres %.1f, workers+fakes+clients %.1f",
		ms(s.total()), ms(s.server), ms(s.postgres), ms(s.self))
}

// historySize returns the number of events in a run's history and their
// encoded size in bytes, to compare the work the server stores per run.
func historySize(ctx context.Context, c client.Client, workflowID string) (events, bytes int, err error) {
	it := c.GetWorkflowHistory(ctx, workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			return 0, 0, fmt.Errorf("read the history of %s: %w", workflowID, err)
		}
		events++
		bytes += protoSize(e)
	}
	return events, bytes, nil
}

// protoSize is an event's encoded size.
func protoSize(m proto.Message) int { return proto.Size(m) }

// machineBusy returns the CPU time the whole machine has spent busy (all
// but idle and iowait) and in all, summed over its CPUs, from /proc/stat;
// zero when it cannot be read.
func machineBusy() (busy, all time.Duration) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := bytes.Cut(raw, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || i >= 8 { // guest time is already in user
			break
		}
		all += time.Duration(n) * proccpu.ClockTick
		if i != 3 && i != 4 { // idle, iowait
			busy += time.Duration(n) * proccpu.ClockTick
		}
	}
	return busy, all
}

// quietShare is the machine's busy share below which waitQuiet calls it
// quiet: the dev server, Postgres and two idle workers use 1-3% of it.
const quietShare = 0.10

// quietLimit bounds waitQuiet in BenchmarkPipelineProcesses.
const quietLimit = 20 * time.Second

// waitQuiet waits until the machine has been busy less than quietShare of
// its capacity over a quarter of a second, or up to limit, and returns how
// long it waited. A batch's runs close before the dev server has written
// their visibility records and done its other deferred work, and Postgres
// its WAL; the next batch, the other side's, would otherwise start on that
// work and pay for it.
func waitQuiet(limit time.Duration) time.Duration {
	begin := time.Now()
	busy0, all0 := machineBusy()
	for time.Since(begin) < limit {
		time.Sleep(250 * time.Millisecond)
		busy, all := machineBusy()
		if all > all0 && float64(busy-busy0) < quietShare*float64(all-all0) {
			break
		}
		busy0, all0 = busy, all
	}
	return time.Since(begin)
}
