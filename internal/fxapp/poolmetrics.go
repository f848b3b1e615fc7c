package fxapp

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector exports the Postgres pool's statistics (pgxpool.Stat) at
// each scrape: its size, how many connections are in use, and how often and
// how long an acquire had to wait, which is what saturation looks like.
type poolCollector struct {
	pool                                   *pgxpool.Pool
	max, acquired, idle, total             *prometheus.Desc
	acquires, emptyAcquires, acquireWaited *prometheus.Desc
}

func newPoolCollector(pool *pgxpool.Pool) *poolCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("keyed_db_pool_"+name, help, nil, nil)
	}
	return &poolCollector{
		pool:          pool,
		max:           d("max_conns", "Most connections the pool may open (pool_max_conns)."),
		acquired:      d("acquired_conns", "Connections in use."),
		idle:          d("idle_conns", "Open connections not in use."),
		total:         d("total_conns", "Open connections."),
		acquires:      d("acquires_total", "Connections acquired from the pool."),
		emptyAcquires: d("empty_acquires_total", "Acquires that found no idle connection and had to wait or open one."),
		acquireWaited: d("acquire_wait_seconds_total", "Time spent acquiring connections."),
	}
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.max, c.acquired, c.idle, c.total, c.acquires, c.emptyAcquires, c.acquireWaited} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(c.max, float64(s.MaxConns()))
	gauge(c.acquired, float64(s.AcquiredConns()))
	gauge(c.idle, float64(s.IdleConns()))
	gauge(c.total, float64(s.TotalConns()))
	counter(c.acquires, float64(s.AcquireCount()))
	counter(c.emptyAcquires, float64(s.EmptyAcquireCount()))
	counter(c.acquireWaited, s.AcquireDuration().Seconds())
}
