package node

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/replvol/replvol/transport"
)

// TestStatusNamesTheReleaseEachNodeRuns: the cluster's status (status
// --json, /api/status) gives the release each node that answered runs,
// as its program told it (replnode's build), and the page shows it on the
// node's row; a node that did not answer has none.
func TestStatusNamesTheReleaseEachNodeRuns(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	want := map[string]string{"alpha": "1.4.0", "beta": "1.4.1~git20261205134441.7d6bd45"}
	for name, v := range want {
		c.opts[name] = Options{Version: v}
	}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	addr := c.nodes["alpha"].ControlAddr()
	get := func(path string) []byte {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	var st transport.ClusterStatus
	if err := json.Unmarshal(get("/api/status"), &st); err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if n.Version != want[n.Name] {
			t.Errorf("/api/status says %s runs %q, want %q", n.Name, n.Version, want[n.Name])
		}
	}
	page := string(get("/"))
	for name, v := range want {
		if !strings.Contains(page, `title="replnode `+v+`">`+name) {
			t.Errorf("the page does not give %s's release %s on its row", name, v)
		}
	}

	c.stop("beta")
	cl, err := transport.DialControl(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cs, err := cl.ClusterStatus(context.Background(), &transport.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range cs.Nodes {
		if n.Name == "beta" && (n.Alive || n.Version != "") {
			t.Errorf("beta stopped: alive %v, version %q; want no version", n.Alive, n.Version)
		}
	}
}
