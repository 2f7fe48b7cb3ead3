package node

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/replvol/replvol/replication"
)

// collector turns volume status into Prometheus metrics at scrape time.
type collector struct {
	n *Node

	role, outOfSync, resynced, writes, writeBytes, reads, readBytes, flushes, connected *prometheus.Desc
}

func newCollector(n *Node) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("replvol_"+name, help, labels, prometheus.Labels{"node": n.name})
	}
	return &collector{
		n:          n,
		role:       d("volume_primary", "1 if this node is primary for the volume.", "volume"),
		outOfSync:  d("peer_out_of_sync_bytes", "Bytes marked out of sync for a peer.", "volume", "peer"),
		connected:  d("peer_connected", "1 if the peer is connected and in sync.", "volume", "peer"),
		resynced:   d("resynced_bytes_total", "Bytes this node received by resync.", "volume"),
		writes:     d("writes_total", "Write requests served.", "volume"),
		writeBytes: d("write_bytes_total", "Bytes written by clients.", "volume"),
		reads:      d("reads_total", "Read requests served.", "volume"),
		readBytes:  d("read_bytes_total", "Bytes read by clients.", "volume"),
		flushes:    d("flushes_total", "Flush requests served.", "volume"),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for name, v := range c.n.vols {
		st := v.status()
		primary := 0.0
		if st.Role == string(replication.Primary) {
			primary = 1
		}
		ch <- prometheus.MustNewConstMetric(c.role, prometheus.GaugeValue, primary, name)
		ch <- prometheus.MustNewConstMetric(c.resynced, prometheus.CounterValue, float64(st.ResyncedBytes), name)
		ch <- prometheus.MustNewConstMetric(c.writes, prometheus.CounterValue, float64(st.Writes), name)
		ch <- prometheus.MustNewConstMetric(c.writeBytes, prometheus.CounterValue, float64(st.WriteBytes), name)
		ch <- prometheus.MustNewConstMetric(c.reads, prometheus.CounterValue, float64(st.Reads), name)
		ch <- prometheus.MustNewConstMetric(c.readBytes, prometheus.CounterValue, float64(st.ReadBytes), name)
		ch <- prometheus.MustNewConstMetric(c.flushes, prometheus.CounterValue, float64(st.Flushes), name)
		for _, p := range st.Peers {
			up := 0.0
			if p.Replication == string(replication.Connected) && p.OutOfSyncBytes == 0 {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(c.outOfSync, prometheus.GaugeValue, float64(p.OutOfSyncBytes), name, p.Node)
			ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, up, name, p.Node)
		}
	}
}
