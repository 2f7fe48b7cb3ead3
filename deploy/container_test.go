package deploy

import (
	"debug/elf"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/node"
	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// composeFile is the part of deploy/compose.yaml the test checks.
type composeFile struct {
	Services map[string]struct {
		Image   string   `yaml:"image"`
		Command []string `yaml:"command"`
		Build   struct {
			Context    string `yaml:"context"`
			Dockerfile string `yaml:"dockerfile"`
		} `yaml:"build"`
		Volumes  []string `yaml:"volumes"`
		Networks map[string]struct {
			IPv4 string `yaml:"ipv4_address"`
		} `yaml:"networks"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
	Networks map[string]struct {
		IPAM struct {
			Config []struct {
				Subnet string `yaml:"subnet"`
			} `yaml:"config"`
		} `yaml:"ipam"`
	} `yaml:"networks"`
	Volumes map[string]any `yaml:"volumes"`
}

// deploy/compose.yaml cannot be run here (no Docker engine): it is
// checked instead. It parses (anchors and merge keys included); alpha,
// beta and witness are built from the Dockerfile and each runs replnode
// as itself with the cluster file compose/cluster.yaml, which loads as
// replnode loads it; each node's addresses there are its service's fixed
// address on the compose network; the data nodes' disk files are made
// large enough for the volume and its metadata before they start.
func TestComposeFileDescribesTwoDataNodesAndAWitness(t *testing.T) {
	raw, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatalf("deploy/compose.yaml: %v", err)
	}
	cfg, err := node.LoadConfig(filepath.Join("compose", "cluster.yaml"))
	if err != nil {
		t.Fatalf("deploy/compose/cluster.yaml does not load: %v", err)
	}
	if len(cfg.Nodes) != 3 {
		t.Fatalf("compose/cluster.yaml has %d nodes, want alpha, beta and witness", len(cfg.Nodes))
	}
	var subnet *net.IPNet
	for _, n := range c.Networks {
		for _, sc := range n.IPAM.Config {
			if _, subnet, err = net.ParseCIDR(sc.Subnet); err != nil {
				t.Fatal(err)
			}
		}
	}
	if subnet == nil {
		t.Fatal("compose.yaml gives its network no subnet: the nodes' addresses in the cluster file would not be theirs")
	}
	witnesses := 0
	for _, n := range cfg.Nodes {
		s, ok := c.Services[n.Name]
		if !ok {
			t.Errorf("compose.yaml has no service for node %s", n.Name)
			continue
		}
		if s.Build.Context != ".." || s.Build.Dockerfile != "Dockerfile" {
			t.Errorf("service %s is not built from the repository's Dockerfile: %+v", n.Name, s.Build)
		}
		if _, err := os.Stat(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil {
			t.Errorf("service %s: %v", n.Name, err)
		}
		if i := slices.Index(s.Command, "--node"); i < 0 || i+1 >= len(s.Command) || s.Command[i+1] != n.Name {
			t.Errorf("service %s runs %v, not --node %s", n.Name, s.Command, n.Name)
		}
		if i := slices.Index(s.Command, "--config"); i < 0 || i+1 >= len(s.Command) || !slices.Contains(s.Volumes, "./compose/cluster.yaml:"+s.Command[i+1]+":ro") {
			t.Errorf("service %s: its --config is not compose/cluster.yaml mounted read-only: %v, %v", n.Name, s.Command, s.Volumes)
		}
		if !slices.ContainsFunc(s.Volumes, func(v string) bool { return strings.HasSuffix(v, ":/var/lib/replvol") }) {
			t.Errorf("service %s keeps its state in no volume: %v", n.Name, s.Volumes)
		}
		var ip string
		for _, nw := range s.Networks {
			ip = nw.IPv4
		}
		if parsed := net.ParseIP(ip); parsed == nil || !subnet.Contains(parsed) {
			t.Errorf("service %s: address %q is not on the network's subnet %s", n.Name, ip, subnet)
		}
		for _, addr := range []string{n.Control, n.Replication, n.NBD, n.Raft, n.Gossip} {
			if addr == "" {
				continue
			}
			if host, _, err := net.SplitHostPort(addr); err != nil || host != ip {
				t.Errorf("node %s: address %s is not its service's %s", n.Name, addr, ip)
			}
		}
		if n.Raft == "" || n.Gossip == "" {
			t.Errorf("node %s has no raft or gossip address: no automatic failover", n.Name)
		}
		if n.IsWitness() {
			witnesses++
			continue
		}
		if s.DependsOn["disks"].Condition != "service_completed_successfully" {
			t.Errorf("service %s does not wait for its disk file (depends_on disks)", n.Name)
		}
	}
	if witnesses != 1 {
		t.Errorf("%d witnesses, want 1", witnesses)
	}

	// The disks service makes each file large enough.
	disks, ok := c.Services["disks"]
	if !ok || len(disks.Command) == 0 {
		t.Fatal("compose.yaml has no disks service")
	}
	m := regexp.MustCompile(`truncate -s (\d+)M`).FindStringSubmatch(strings.Join(disks.Command, " "))
	if m == nil {
		t.Fatalf("the disks service makes no file: %v", disks.Command)
	}
	mib, _ := strconv.ParseInt(m[1], 10, 64)
	for _, v := range cfg.Volumes {
		need, err := metadata.InternalDeviceSizeFor(int64(v.Size), v.ALExtents, 1, v.ChecksumsOn())
		if err != nil {
			t.Fatal(err)
		}
		if mib<<20 < need {
			t.Errorf("the disk files have %d MiB; volume %s needs %d bytes with its metadata", mib, v.Name, need)
		}
		for name, d := range v.Disks {
			if len(d.Paths) != 1 || d.Paths[0].Path != "/data/disk.img" {
				t.Errorf("volume %s on %s: disk %+v, want /data/disk.img", v.Name, name, d)
			}
			if !slices.Contains(c.Services[name].Volumes, name+"-data:/data") || !slices.Contains(disks.Volumes, name+"-data:/"+name) {
				t.Errorf("node %s's disk is not the volume %s-data the disks service fills", name, name)
			}
		}
	}
}

// The Dockerfile cannot be built here (no Docker engine); what it runs
// can. Its final stage is scratch or distroless on replnode as entry
// point; its builder is the Go the Makefile pins; and its go build
// command, run here as written, makes static binaries (no interpreter,
// no shared library) that print the version it was given.
func TestTheDockerfileBuildsStaticBinaries(t *testing.T) {
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	var froms []string
	var build string
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "FROM" {
			froms = append(froms, f[1])
		}
		if strings.HasPrefix(line, "RUN CGO_ENABLED=0 go build ") {
			build = strings.TrimPrefix(line, "RUN ")
		}
	}
	if len(froms) < 2 {
		t.Fatalf("the Dockerfile has stages %v, want a builder and a final stage", froms)
	}
	if final := froms[len(froms)-1]; final != "scratch" && !strings.HasPrefix(final, "gcr.io/distroless/static") {
		t.Errorf("final stage FROM %s, want scratch or gcr.io/distroless/static", final)
	}
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	pinned := regexp.MustCompile(`(?m)^export GOTOOLCHAIN \?= go(\S+)`).FindSubmatch(mk)
	if pinned == nil || !strings.HasPrefix(froms[0], "golang:"+string(pinned[1])+"-") {
		t.Errorf("the builder is FROM %s; the Makefile builds with go%s", froms[0], pinned[1])
	}
	if !strings.Contains(text, `ENTRYPOINT ["/usr/bin/replnode"`) {
		t.Error("the Dockerfile's entry point is not /usr/bin/replnode")
	}
	if build == "" {
		t.Fatal("the Dockerfile has no RUN CGO_ENABLED=0 go build line")
	}
	out := t.TempDir()
	cmd := strings.ReplaceAll(build, "/out/", out+"/")
	mustRun(t, "the Dockerfile's build", repoRoot(t), 10*time.Minute, []string{"VERSION=9.9.9-test"}, "sh", "-c", cmd)
	for _, bin := range []string{"replnode", "replctl", "replcsi"} {
		path := filepath.Join(out, bin)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s has an ELF interpreter: not static", bin)
			}
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("%s needs shared libraries %v: not static", bin, libs)
		}
		f.Close()
		if v := mustRun(t, bin+" --version", "", 10*time.Second, nil, path, "--version"); !strings.HasPrefix(v, bin+" 9.9.9-test") {
			t.Errorf("%s --version: %q, want the VERSION the build was given", bin, v)
		}
	}
	// Without VERSION (the Dockerfile's default), the release and the
	// commit come from the checkout the image copies in, as make's do.
	head := strings.TrimSpace(mustRun(t, "git rev-parse HEAD", repoRoot(t), 10*time.Second, nil, "git", "rev-parse", "HEAD"))
	plain := strings.ReplaceAll(build, "${VERSION}", "")
	mustRun(t, "the Dockerfile's build without VERSION", repoRoot(t), 10*time.Minute, nil, "sh", "-c", strings.ReplaceAll(plain, "/out/", out+"/"))
	v := mustRun(t, "replctl --version", "", 10*time.Second, nil, filepath.Join(out, "replctl"), "--version")
	if !strings.Contains(v, "revision "+head[:12]) || strings.HasPrefix(v, "replctl dev") || strings.HasPrefix(v, "replctl 0.0.0+container") {
		t.Errorf("replctl built as the Dockerfile builds it, without VERSION: %q; want the release and the revision %s of the checkout", v, head[:12])
	}
}

// dockerStage is one stage of a Dockerfile: its base, its name (AS) and
// its instructions.
type dockerStage struct {
	from, name string
	lines      []string
}

// dockerStages splits a Dockerfile into its stages (continuation lines
// joined).
func dockerStages(text string) []dockerStage {
	var stages []dockerStage
	joined := strings.ReplaceAll(text, "\\\n", " ")
	for _, line := range strings.Split(joined, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if f[0] == "FROM" && len(f) >= 2 {
			st := dockerStage{from: f[1]}
			if len(f) >= 4 && strings.EqualFold(f[2], "AS") {
				st.name = f[3]
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, strings.Join(f, " "))
		}
	}
	return stages
}

// copiedFromBuild lists the files a stage copies from the build stage's
// /out/, by name, and where to.
func (s dockerStage) copiedFromBuild() (names []string, dest string) {
	for _, l := range s.lines {
		f := strings.Fields(l)
		if len(f) < 4 || f[0] != "COPY" || f[1] != "--from=build" {
			continue
		}
		for _, src := range f[2 : len(f)-1] {
			if name, ok := strings.CutPrefix(src, "/out/"); ok && name != "state" {
				names = append(names, name)
				dest = f[len(f)-1]
			}
		}
	}
	return names, dest
}

// The Dockerfile builds replcsi with replnode and replctl: the default
// image carries all three, and the stage replcsi (docker build --target
// replcsi), which deploy/kubernetes runs, carries replcsi and the replctl
// it runs in /usr/bin, on a base with the tools its node service runs,
// with replcsi as its entry point. Every container of deploy/kubernetes
// that runs the image replvol/replcsi runs /usr/bin/replcsi.
func TestTheDockerfileShipsReplcsiForTheKubernetesManifests(t *testing.T) {
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := dockerStages(string(raw))
	if len(stages) < 3 {
		t.Fatalf("the Dockerfile has stages %+v, want a builder, replcsi and the final one", stages)
	}
	final := stages[len(stages)-1]
	if bins, dest := final.copiedFromBuild(); dest != "/usr/bin/" || !slices.Contains(bins, "replnode") || !slices.Contains(bins, "replctl") || !slices.Contains(bins, "replcsi") {
		t.Errorf("the default image copies %v to %s, want replnode, replctl and replcsi in /usr/bin/", bins, dest)
	}
	var csi *dockerStage
	for i := range stages {
		if stages[i].name == "replcsi" {
			csi = &stages[i]
		}
	}
	if csi == nil {
		t.Fatal("the Dockerfile has no stage named replcsi (docker build --target replcsi)")
	}
	if strings.HasPrefix(csi.from, "gcr.io/distroless/") || csi.from == "scratch" {
		t.Errorf("the stage replcsi is FROM %s: its node service runs mount, losetup, mkfs and fusermount, which need a base with them", csi.from)
	}
	if bins, dest := csi.copiedFromBuild(); dest != "/usr/bin/" || !slices.Contains(bins, "replcsi") || !slices.Contains(bins, "replctl") {
		t.Errorf("the stage replcsi copies %v to %s, want replcsi and replctl in /usr/bin/ (replcsi runs the replctl beside it)", bins, dest)
	}
	text := strings.Join(csi.lines, "\n")
	for _, pkg := range []string{"util-linux", "mount", "e2fsprogs", "xfsprogs", "fuse3"} {
		if !regexp.MustCompile(`(?m)^RUN .*apt-get install .*\b` + regexp.QuoteMeta(pkg) + `\b`).MatchString(text) {
			t.Errorf("the stage replcsi does not install %s", pkg)
		}
	}
	if !slices.Contains(csi.lines, `ENTRYPOINT ["/usr/bin/replcsi"]`) {
		t.Errorf("the stage replcsi's entry point is not /usr/bin/replcsi: %q", csi.lines)
	}

	objs, errs := decodeManifests("kubernetes")
	for _, err := range errs {
		t.Error(err)
	}
	runs := 0
	for _, o := range objs {
		var spec *corev1.PodSpec
		switch o := o.(type) {
		case *appsv1.Deployment:
			spec = &o.Spec.Template.Spec
		case *appsv1.DaemonSet:
			spec = &o.Spec.Template.Spec
		default:
			continue
		}
		for _, c := range spec.Containers {
			if imageName(c.Image) != "replvol/replcsi" {
				continue
			}
			runs++
			if !slices.Equal(c.Command, []string{"/usr/bin/replcsi"}) {
				t.Errorf("container %s runs the image replvol/replcsi with command %q, want [/usr/bin/replcsi]", c.Name, c.Command)
			}
		}
	}
	if runs != 2 {
		t.Errorf("%d containers run the image replvol/replcsi, want 2 (the controller and the node plugin)", runs)
	}
}
