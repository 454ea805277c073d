package relay

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector reports the writer pool's connections at each scrape. Every
// write and most reads hold one of these connections: when they run out,
// events and REQs wait in Acquire, which no statement timer sees. The
// waits say whether BUZZ_DB_MAX_CONNS is too small for the load; new
// connections say how often a session starts cold (its first INSERT pays
// PostgreSQL's per-session set-up, about 15 ms on the dev box).
type poolCollector struct {
	pool                                                          *pgxpool.Pool
	max, conns, acquires, waits, waitSeconds, newConns, cancelled *prometheus.Desc
}

func newPoolCollector(pool *pgxpool.Pool) *poolCollector {
	return &poolCollector{
		pool: pool,
		max: prometheus.NewDesc("buzz_db_pool_max",
			"The writer pool's connection limit (BUZZ_DB_MAX_CONNS).", nil, nil),
		conns: prometheus.NewDesc("buzz_db_pool_conns",
			"Writer pool connections now, by state: acquired (in use), idle, constructing (being opened).", []string{"state"}, nil),
		acquires: prometheus.NewDesc("buzz_db_pool_acquires_total",
			"Connections taken from the writer pool.", nil, nil),
		waits: prometheus.NewDesc("buzz_db_pool_acquire_waits_total",
			"Acquires that found no idle connection and waited for one to be released or opened.", nil, nil),
		waitSeconds: prometheus.NewDesc("buzz_db_pool_acquire_wait_seconds_total",
			"Time those acquires waited, in all.", nil, nil),
		newConns: prometheus.NewDesc("buzz_db_pool_new_conns_total",
			"Connections the writer pool opened.", nil, nil),
		cancelled: prometheus.NewDesc("buzz_db_pool_cancelled_acquires_total",
			"Acquires given up because their context ended while they waited (a request's timeout, a closed connection).", nil, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.max, c.conns, c.acquires, c.waits, c.waitSeconds, c.newConns, c.cancelled} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.pool.Stat() // one snapshot, so the series of a scrape agree
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(c.max, float64(st.MaxConns()))
	gauge(c.conns, float64(st.AcquiredConns()), "acquired")
	gauge(c.conns, float64(st.IdleConns()), "idle")
	gauge(c.conns, float64(st.ConstructingConns()), "constructing")
	counter(c.acquires, float64(st.AcquireCount()))
	counter(c.waits, float64(st.EmptyAcquireCount()))
	counter(c.waitSeconds, st.EmptyAcquireWaitTime().Seconds())
	counter(c.newConns, float64(st.NewConnsCount()))
	counter(c.cancelled, float64(st.CanceledAcquireCount()))
}
