package node

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestControlAPIWebPageAndMetricsShareTheControlPort(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	addr := c.nodes["beta"].ControlAddr()
	ctx := context.Background()

	// gRPC control API, through the node's HTTP/2 listener.
	cl, err := transport.DialControl(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	st, err := cl.ClusterStatus(ctx, &transport.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.From != "beta" || st.Volumes[0].Primary != "alpha" || !strings.HasPrefix(st.Volumes[0].NBDURI, "nbd://") {
		t.Fatalf("cluster status: %+v", st.Volumes[0])
	}
	_, err = cl.Connect(ctx, &transport.ConnectRequest{Volume: "nope"})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "holds no volume") {
		t.Fatalf("connect to an unknown volume: %v", err)
	}

	get := func(path string) string {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s", path, resp.Status)
		}
		return string(body)
	}
	var js transport.ClusterStatus
	if err := json.Unmarshal([]byte(get("/api/status")), &js); err != nil || len(js.Volumes) != 1 {
		t.Fatalf("/api/status: %v %+v", err, js)
	}
	page := get("/")
	for _, want := range []string{"Volume vol0", "alpha", "beta", "UpToDate"} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	metrics := get("/metrics")
	for _, want := range []string{`replvol_volume_primary{node="beta",volume="vol0"} 0`, "replvol_resynced_bytes_total"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestClusterStatusShowsAnUnreachableNode(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	c.stop("beta")
	st := c.status()
	for _, n := range st.Nodes {
		if n.Name == "beta" && (n.Alive || n.Error == "") {
			t.Fatalf("stopped beta shows as %+v", n)
		}
	}
	r := replica(st, "beta")
	if r.Reachable || r.Role != "Unknown" {
		t.Fatalf("beta replica: %+v", r)
	}
	eventually(t, func() bool { return replica(c.status(), "beta").Disk != "UpToDate" }, "beta no longer counted UpToDate")
}
