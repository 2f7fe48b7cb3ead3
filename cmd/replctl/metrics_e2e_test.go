package main

import (
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestE2EMetricsPassPromtool: each node of a running demo serves /metrics
// that pass `promtool check metrics`, with the state of both replicas
// (not only on the primary), the primary's link to beta, and the IO an NBD
// client just did.
func TestE2EMetricsPassPromtool(t *testing.T) {
	e2e(t)
	promtool := RequireTool(t, "promtool", "prometheus")
	d := startDemo(t)
	d.waitInSync("alpha")

	c, err := dialRawNBD(d.uri)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if errno, err := c.write(0, bytes.Repeat([]byte{0xab}, 64<<10)); err != nil || errno != 0 {
		t.Fatalf("NBD write: errno %d, %v", errno, err)
	}

	want := map[string][]string{
		"alpha": {
			`replvol_peer_connected{node="alpha",peer="beta",volume="vol0"} 1`,
			`replvol_peer_in_sync{node="alpha",peer="beta",volume="vol0"} 1`,
			`replvol_volume_serving{node="alpha",volume="vol0"} 1`,
		},
		"beta": {
			`replvol_peer_connected{node="beta",peer="alpha",volume="vol0"} 1`,
			`replvol_volume_primary{node="beta",volume="vol0"} 0`,
		},
	}
	for _, node := range []string{"alpha", "beta"} {
		url := "http://" + d.nodes[node].Control + "/metrics"
		lines := append(want[node],
			`replvol_replica_disk_state{node="alpha",state="UpToDate",volume="vol0"} 1`,
			`replvol_replica_disk_state{node="beta",state="UpToDate",volume="vol0"} 1`,
			`replvol_replica_role{node="alpha",state="Primary",volume="vol0"} 1`,
			`replvol_replica_replication_state{node="beta",state="Connected",volume="vol0"} 1`,
		)
		body := metricsScrapeUntil(t, url, lines)
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool check metrics on %s: %v\n%s", url, err, out)
		}
		t.Logf("%s: %d series pass promtool check metrics", url, strings.Count(body, "\n")-2*strings.Count(body, "# HELP"))
		if node == "alpha" {
			for _, series := range []string{`replvol_writes_total{node="alpha",volume="vol0"}`, `replvol_nbd_requests_total{node="alpha",op="write"}`} {
				if v := metricsSampleOf(body, series); v < 1 {
					t.Errorf("%s: %s is %v after an NBD write", url, series, v)
				}
			}
		}
	}
}

// metricsScrapeUntil GETs url until its body holds every line (the cluster view
// is cached for a second), and returns the last body.
func metricsScrapeUntil(t *testing.T, url string, lines []string) string {
	t.Helper()
	var body string
	var lacking []string
	if !within(15*time.Second, 200*time.Millisecond, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s %v", url, resp.Status, err)
		}
		body = string(b)
		lacking = nil
		for _, l := range lines {
			if !strings.Contains(body, "\n"+l+"\n") {
				lacking = append(lacking, l)
			}
		}
		return len(lacking) == 0
	}) {
		t.Fatalf("GET %s lacks %q after 15 s:\n%s", url, lacking, body)
	}
	return body
}

// metricsSampleOf returns the value of one series in a scrape (-1 when absent).
func metricsSampleOf(body, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return -1
	}
	return v
}
