package volmount

import (
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/replvol/replvol/transport/nbdclient"
)

// TestKernelSteps: what /dev/nbdN is told, in order: the sockets first (NBD_SET_SOCK claims
// the device, so nothing of a device another client holds is changed), then block size, size
// in blocks, the server's transmission flags and the timeout in whole seconds.
func TestKernelSteps(t *testing.T) {
	const multiConn = nbdclient.FlagHasFlags | nbdclient.FlagSendFlush | nbdclient.FlagSendFUA | nbdclient.FlagSendTrim | nbdclient.FlagCanMultiConn
	ex := nbdclient.Export{Size: 64 << 20, Flags: multiConn, PreferredBlock: 4096}
	got, err := kernelSteps(ex, []int{7, 8, 9, 10}, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	want := []ioctlStep{
		{"NBD_SET_SOCK", 0xab00, 7}, {"NBD_SET_SOCK", 0xab00, 8}, {"NBD_SET_SOCK", 0xab00, 9}, {"NBD_SET_SOCK", 0xab00, 10},
		{"NBD_SET_BLKSIZE", 0xab01, 4096},
		{"NBD_SET_SIZE_BLOCKS", 0xab07, 16384},
		{"NBD_SET_FLAGS", 0xab0a, multiConn},
		{"NBD_SET_TIMEOUT", 0xab09, 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("steps:\n got %v\nwant %v", got, want)
	}
	noTimeout, err := kernelSteps(ex, []int{3}, 0)
	if err != nil || noTimeout[len(noTimeout)-1].Name != "NBD_SET_FLAGS" {
		t.Fatalf("without a timeout: %v, %v", noTimeout, err)
	}
	if _, err := kernelSteps(nbdclient.Export{Size: 1000}, []int{3}, 0); err == nil || !strings.Contains(err.Error(), "1000 bytes") {
		t.Fatalf("a size of no whole block: %v", err)
	}
	if _, err := kernelSteps(ex, nil, 0); err == nil {
		t.Fatal("no sockets was taken")
	}
}

func TestBlockSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		ex   nbdclient.Export
		want int64
	}{
		{"the server prefers 4096", nbdclient.Export{Size: 1 << 30, PreferredBlock: 4096}, 4096},
		{"the server prefers 512", nbdclient.Export{Size: 1 << 30, PreferredBlock: 512}, 512},
		{"no preference", nbdclient.Export{Size: 1 << 30}, 4096},
		{"a preference the kernel cannot take", nbdclient.Export{Size: 1 << 30, PreferredBlock: 65536}, 4096},
		{"a size of 512-byte blocks only", nbdclient.Export{Size: 1<<30 + 512}, 512},
	} {
		if got := blockSize(tc.ex); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestChooseVia: the kernel's driver when /dev/nbd0 exists, FUSE otherwise, and a refusal
// that says what to load.
func TestChooseVia(t *testing.T) {
	for _, tc := range []struct {
		name          string
		want          Via
		nbd, fuse     bool
		got           Via
		errorMentions string
	}{
		{"auto with the nbd module", ViaAuto, true, true, ViaKernel, ""},
		{"auto without it", ViaAuto, false, true, ViaFUSE, ""},
		{"auto with neither", ViaAuto, false, false, "", "modprobe nbd"},
		{"kernel asked, no module", ViaKernel, false, true, "", "--via fuse"},
		{"fuse asked where nbd exists", ViaFUSE, true, true, ViaFUSE, ""},
		{"fuse asked, no /dev/fuse", ViaFUSE, true, false, "", "modprobe fuse"},
		{"a way that does not exist", "carrier-pigeon", true, true, "", "auto, kernel or fuse"},
	} {
		got, err := chooseVia(tc.want, tc.nbd, tc.fuse)
		if got != tc.got || (tc.errorMentions == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.errorMentions)) {
			t.Errorf("%s: %q, %v; want %q, an error mentioning %q", tc.name, got, err, tc.got, tc.errorMentions)
		}
	}
}

// TestFreeNBDDevices: a device with a pid file in sysfs is held by a client.
func TestFreeNBDDevices(t *testing.T) {
	sys := fstest.MapFS{
		"nbd0/size":  {Data: []byte("0\n")},
		"nbd1/pid":   {Data: []byte("4242\n")},
		"nbd10/size": {Data: []byte("0\n")},
		"nbd2/size":  {Data: []byte("0\n")},
		"loop0/size": {Data: []byte("0\n")},
		"sda/size":   {Data: []byte("0\n")},
	}
	got, err := freeNBDDevices(sys)
	if want := []string{"/dev/nbd0", "/dev/nbd2", "/dev/nbd10"}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("free devices %v, %v; want %v", got, err, want)
	}
}

// TestKernelSocketRelaysATLSConnection: a connection that is not plain TCP (TLS) reaches the
// kernel through a socket pair this process relays, both ways, and closing the kernel's end
// closes the connection.
func TestKernelSocketRelaysATLSConnection(t *testing.T) {
	ours, theirs := net.Pipe()
	f, err := kernelSocket(ours)
	if err != nil {
		t.Fatal(err)
	}
	kernel, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = kernel.Write([]byte("request")) }()
	b := make([]byte, 7)
	if _, err := io.ReadFull(theirs, b); err != nil || string(b) != "request" {
		t.Fatalf("the server got %q, %v", b, err)
	}
	go func() { _, _ = theirs.Write([]byte("reply")) }()
	b = make([]byte, 5)
	if _, err := io.ReadFull(kernel, b); err != nil || string(b) != "reply" {
		t.Fatalf("the kernel got %q, %v", b, err)
	}
	kernel.Close()
	_ = theirs.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := theirs.Read(b); err != io.EOF {
		t.Fatalf("the connection after the kernel's end closed: %v, want EOF", err)
	}
}

// TestHelperArgsRoundTrip: what Mount tells the helper is what it reads.
func TestHelperArgsRoundTrip(t *testing.T) {
	for _, c := range []HelperConfig{
		{Via: ViaFUSE, URI: "nbds://127.0.0.1:7802/vol0", TLSDir: "/etc/replvol/tls", FUSEDir: "/run/replvol/mounts/srv%2Fdata.fuse", Name: "vol0", Connections: 4, IOTimeout: time.Minute},
		{Via: ViaKernel, URI: "nbd://10.0.0.1:7802/vol1", Connections: 1},
		{Via: ViaFUSE, URI: "nbd://127.0.0.1:7802/vol2", FUSEDir: "/run/replvol/mounts/mnt.fuse", Name: "vol2", Connections: 1, IOTimeout: time.Minute,
			Follow: true, Volume: "vol2", Controls: []string{"127.0.0.1:7800", "10.0.0.2:7800"}, FollowingPath: "/run/replvol/mounts/mnt.following",
			ClaimID: "0123456789abcdef", ClaimHost: "client", ClaimDir: "/mnt"},
		{Via: ViaFUSE, URI: "nbd://127.0.0.1:7802/vol3", FUSEDir: "/run/replvol/mounts/m3.fuse", Name: "vol3", Connections: 1,
			Follow: true, Volume: "vol3", Controls: []string{"127.0.0.1:7800"}, FollowingPath: "/run/replvol/mounts/m3.following", RefreshEvery: time.Second},
	} {
		got, err := ParseHelperArgs(c.Args())
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Errorf("ParseHelperArgs(%q) = %+v, %v; want %+v", c.Args(), got, err, c)
		}
	}
	for _, bad := range [][]string{{"--via", "fuse", "--uri", "nbd://h/v"}, {"--via", "x", "--uri", "nbd://h/v"}, {"--via", "kernel"}, {"--via", "kernel", "--uri", "nbd://h/v", "extra"},
		{"--via", "kernel", "--uri", "nbd://h/v", "--follow", "--volume", "v", "--controls", "h:1", "--following", "/f"},
		{"--via", "fuse", "--uri", "nbd://h/v", "--fuse-dir", "/d", "--name", "v", "--follow"},
		{"--via", "fuse", "--uri", "nbd://h/v", "--fuse-dir", "/d", "--name", "v", "--follow", "--volume", "v", "--controls", "h:1", "--following", "/f", "--refresh-every", "-1s"}} {
		if _, err := ParseHelperArgs(bad); err == nil {
			t.Errorf("ParseHelperArgs(%q) took it", bad)
		}
	}
}
