package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/internal/volmount"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/nbdclient"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// mountHelperCommand is the hidden command replctl mount starts as its helper process.
const mountHelperCommand = "mount-helper"

// runDirFlag adds --run-dir, where replctl mount keeps its records.
func runDirFlag(cmd *cobra.Command, dir *string) {
	def := os.Getenv("REPLCTL_RUN_DIR")
	if def == "" {
		def = volmount.DefaultRunDir
	}
	cmd.Flags().StringVar(dir, "run-dir", def, "where replctl mount records what it set up, for replctl umount (env REPLCTL_RUN_DIR)")
}

func newMount(g *globals) *cobra.Command {
	var (
		fstype, via, options, runDir string
		mkfs, force, follow          bool
		connections                  int
		ioTimeout, refreshEvery      time.Duration
	)
	cmd := &cobra.Command{
		Use:   "mount [VOLUME DIR] [--fstype ext4|xfs] [--mkfs [--force]] [--follow]",
		Short: "Mount a volume's file system on DIR, on the volume's primary or, with --follow, on any host",
		Long: `Mount VOLUME's file system on DIR. Run it as root on the volume's primary: on a
secondary it is refused, naming the primary. replctl asks the node at --addr
(its unix socket on the node's host: --addr unix:///var/lib/replvol/control.sock)
for the export, then attaches it:

  - with /dev/nbd* (the nbd kernel module), through the kernel's nbd driver, as
    /dev/nbdN, with --connections connections when the server offers multi-conn;
  - otherwise as a file served through FUSE by a helper process (replctl
    mount-helper, the NBD client) and put on a loop device.

An nbds:// export (a cluster with a tls: section) is reached with the NBD client's
certificate in --tls-dir's nbd-client/ directory, as replctl certs init wrote it.
With --mkfs a file system is made first (--fstype, ext4 by default); --mkfs on a
volume that holds one is refused unless --force. What was set up is recorded in
--run-dir; replctl umount DIR undoes it. Without arguments, lists the mounts
replctl mount made on this host.

A volume is mounted at most once, on any host: before it connects, replctl mount
takes the volume's claim from the primary, naming this host, DIR and an ID kept
in the record. A mount of a volume mounted elsewhere is refused, naming that
host and directory and how to unmount it; --force does not change that. The
primary keeps the claim while the mount's NBD connections are open and
--io-timeout (a minute with 0) after the last one closed, so that a host that
crashed does not hold the volume for ever; a switchover is refused while it
lasts. replctl umount gives it back. Without --follow a failover ends it (the
mount's client does not follow the primary), so the new primary's on_promote can
mount at once.

With --follow the mount may be made on any host, replica or not: --addr is any
node of the cluster, and replctl finds the primary through it (the cluster's
nodes and their control addresses, kept in the record). When the primary dies
or hands over, the helper finds the new primary the same way (waiting through
the election), takes the claim there under the same ID BEFORE it connects (so
a mount elsewhere is still refused, and a mount that took the volume meanwhile
ends the following), and sends every request the old primary did not answer
again, in the order they were sent, before any new one: the file system sees a
pause of about the failover time, and no error. A write the old primary
answered is never sent again. With no primary for --io-timeout (0: wait for
ever) the requests fail with I/O errors and the helper stops following. It
connects only to a node that says itself it is the primary, over one NBD
connection (--connections is not used), through FUSE (not --via kernel). A
switchover is not refused for a following mount (it is for any other): the old
primary drains its requests and the helper sends them to the new one. Under
protocol A or B a write acknowledged before the peer held it may be missing
after a failover (not after a switchover), as those protocols allow. The
listing shows each following mount's current primary.

A mount through FUSE, following or not, grows with its volume: NBD tells no
client that an export grew (replctl resize), so the helper asks the primary
every --refresh-every (a handshake that moves no data), and when it grew it
connects again (the requests in flight are answered first), grows its file and
makes the loop device read its capacity again; then grow the file system
(resize2fs DEVICE, xfs_growfs DIR). The kernel's nbd driver keeps the size it
was given: such a mount is unmounted and mounted again to see the new size.

When the helper of a mount on DIR is gone (it crashed), replctl mount on DIR
again undoes what is left and mounts it again under the same claim.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 0 && len(args) != 2 {
				return fmt.Errorf("accepts VOLUME and DIR (or nothing, to list), received %d argument(s)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			reg := volmount.Registry{Dir: runDir}
			if len(args) == 0 {
				return listMounts(cmd, reg)
			}
			switch {
			case fstype != "" && fstype != "ext4" && fstype != "xfs":
				return usageErrorf("--fstype %q: replctl mount makes and mounts ext4 or xfs", fstype)
			case force && !mkfs:
				return usageErrorf("--force goes with --mkfs: it lets --mkfs replace a file system")
			case connections < 1 || connections > nbdclient.MaxConnections:
				return usageErrorf("--connections %d: give 1 to %d", connections, nbdclient.MaxConnections)
			case ioTimeout < 0:
				return usageErrorf("--io-timeout %s: give a duration (0: no timeout)", ioTimeout)
			case refreshEvery <= 0:
				return usageErrorf("--refresh-every %s: give a positive duration", refreshEvery)
			case cmd.Flags().Changed("refresh-every") && volmount.Via(via) == volmount.ViaKernel:
				return usageErrorf("--refresh-every goes with --via fuse or auto: the kernel's nbd driver keeps the size it was given")
			}
			switch volmount.Via(via) {
			case volmount.ViaAuto, volmount.ViaKernel, volmount.ViaFUSE:
			default:
				return usageErrorf("--via %q: give auto, kernel or fuse", via)
			}
			volume := args[0]
			dir, err := mountPoint(args[1])
			if err != nil {
				return err
			}
			if os.Geteuid() != 0 {
				return errors.New("replctl mount attaches a device and mounts a file system: run it as root")
			}
			if follow && volmount.Via(via) == volmount.ViaKernel {
				return usageErrorf("--follow goes with --via fuse or auto: the kernel's nbd driver holds its connections itself and cannot send again what the old primary did not answer")
			}
			target, err := g.attachTarget(cmd, volume, follow, func(addr string) string { return retryMount(cmd, args, addr) })
			if err != nil {
				return err
			}
			rec, err := volmount.Mount(cmd.Context(), target.request(volmount.Request{
				Dir: dir, Volume: volume, Via: volmount.Via(via),
				FSType: fstype, MakeFS: mkfs, Force: force, Options: options,
				Connections: connections, IOTimeout: ioTimeout, Registry: reg,
				RefreshEvery: refreshEvery,
			}, g.timeout))
			if err != nil {
				return err
			}
			primary := target.primary
			how := "the kernel's nbd driver"
			if rec.Via == volmount.ViaFUSE {
				how = "a FUSE file on a loop device"
			}
			following := ""
			if rec.Follow {
				following = ", following the primary"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s mounted on %s: %s on %s (%s), from %s over %d NBD connections%s, claimed on %s for %s; replctl umount %s undoes it\n",
				volume, dir, rec.FSType, rec.Device, how, rec.Export, rec.Connections, following, primary, rec.Claim.Host, dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&fstype, "fstype", "", "the file system: ext4 or xfs (default: the one the volume holds; ext4 with --mkfs)")
	cmd.Flags().BoolVar(&mkfs, "mkfs", false, "make the file system first")
	cmd.Flags().BoolVar(&force, "force", false, "with --mkfs: replace the file system the volume holds (what it holds is lost)")
	cmd.Flags().StringVarP(&options, "options", "o", "", "mount options, as mount -o takes them (noatime,discard, ...)")
	cmd.Flags().StringVar(&via, "via", string(volmount.ViaAuto), "how to attach: auto (kernel when /dev/nbd0 exists, else fuse), kernel or fuse")
	cmd.Flags().IntVar(&connections, "connections", 4, "NBD connections, when the server offers multi-conn")
	cmd.Flags().DurationVar(&ioTimeout, "io-timeout", time.Minute, "fail a request the primary does not answer in this time with an IO error (0: wait for ever); with --follow: the time without a primary")
	cmd.Flags().BoolVar(&follow, "follow", false, "follow the primary: mount from any host, find the new primary when it dies or hands over, and send what it did not answer again")
	cmd.Flags().DurationVar(&refreshEvery, "refresh-every", volmount.DefaultRefreshEvery, "through FUSE: how often to ask the primary whether the volume grew (the loop device then grows; grow the file system with resize2fs or xfs_growfs)")
	runDirFlag(cmd, &runDir)
	return cmd
}

// attachment is where replctl mount or attach connects: the export, its primary, and, with
// --follow, the cluster's control addresses.
type attachment struct {
	uri, primary, control string
	tlsDir                string // absolute
	exe                   string
	follow                bool
	controls              []string
}

// attachTarget finds volume's export: at --addr, which must be its primary; with follow
// through --addr, any node of the cluster.
func (g *globals) attachTarget(cmd *cobra.Command, volume string, follow bool, retry func(addr string) string) (attachment, error) {
	a := attachment{follow: follow, control: g.addr}
	var err error
	if a.exe, err = os.Executable(); err != nil {
		return a, fmt.Errorf("find replctl's own executable for the helper: %w", err)
	}
	if g.tlsDir != "" {
		if a.tlsDir, err = filepath.Abs(g.tlsDir); err != nil {
			return a, usageErrorf("--tls-dir %s: %v", g.tlsDir, err)
		}
	}
	if !follow {
		a.uri, a.primary, err = g.exportToMount(cmd, volume, retry)
		return a, err
	}
	pr, finder, err := g.primaryToFollow(cmd.Context(), volume, a.tlsDir)
	if err != nil {
		return a, err
	}
	a.uri, a.primary, a.control, a.controls = pr.URI, pr.Name, pr.Control, finder.addrs
	return a, nil
}

// request completes req with where to connect, the helper and the claim.
func (a attachment) request(req volmount.Request, timeout time.Duration) volmount.Request {
	req.URI, req.TLSDir = a.uri, a.tlsDir
	req.Helper = []string{a.exe, mountHelperCommand}
	req.Claim = &volmount.Claim{Node: a.primary, Addr: a.control, TLSDir: a.tlsDir, Grace: req.IOTimeout}
	req.Claimer = claimer{timeout: timeout}
	req.Follow, req.Controls = a.follow, a.controls
	return req
}

// mountPoint is DIR made absolute with its symbolic links resolved; it must be a directory.
func mountPoint(arg string) (string, error) {
	abs, err := filepath.Abs(arg)
	if err != nil {
		return "", usageErrorf("DIR %q: %v", arg, err)
	}
	dir, err := filepath.EvalSymlinks(abs)
	if errors.Is(err, os.ErrNotExist) {
		return "", usageErrorf("DIR %s does not exist: create it (mkdir -p %s)", abs, abs)
	}
	if err != nil {
		return "", usageErrorf("DIR %s: %v", abs, err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", usageErrorf("DIR %s is not a directory", abs)
	}
	if dir == "/" {
		return "", usageErrorf("DIR /: choose a directory of its own")
	}
	return dir, nil
}

// exportToMount asks the node at --addr for volume's export: it must be the volume's primary
// and serve it. A primary that does not serve yet (just promoted: replctl mount in its
// on_promote) is waited for, until --timeout. It returns the export's URI and the primary's
// name; retry is the command to run at the primary's control address, for a refusal.
func (g *globals) exportToMount(cmd *cobra.Command, volume string, retry func(addr string) string) (uri, primary string, err error) {
	k, err := g.dial(cmd, "")
	if err != nil {
		return "", "", err
	}
	defer k.close()
	for {
		st, err := k.status()
		if err != nil {
			return "", "", k.fail(err, volume, "")
		}
		uri, waitFor, err := mountTarget(st, volume)
		var np *notPrimaryError
		if errors.As(err, &np) && np.PrimaryAddr != "" {
			np.Retry = retry(np.PrimaryAddr)
		}
		if err != nil {
			return "", "", err
		}
		if waitFor == "" {
			return uri, st.From, g.checkNBDCertificate(uri)
		}
		select {
		case <-k.ctx.Done():
			return "", "", fmt.Errorf("%s: waited %s (--timeout) for it to serve", waitFor, g.timeout)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// retryMount is the replctl mount command of cmd, with args, at the control address addr:
// the flags the user gave, --addr replaced.
func retryMount(cmd *cobra.Command, args []string, addr string) string {
	words := []string{"replctl", "--addr", shellWord(addr), "mount"}
	for _, a := range args {
		words = append(words, shellWord(a))
	}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		switch {
		case f.Name == "addr":
		case f.Value.Type() == "bool" && f.Value.String() == "true":
			words = append(words, "--"+f.Name)
		default:
			words = append(words, "--"+f.Name, shellWord(f.Value.String()))
		}
	})
	return strings.Join(words, " ")
}

// shellWord quotes s for a shell when it needs it.
func shellWord(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,@%+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// checkNBDCertificate checks, before anything is set up, that an nbds:// export can be
// reached: --tls-dir must hold the NBD client's certificate.
func (g *globals) checkNBDCertificate(uri string) error {
	u, err := nbdclient.ParseURI(uri)
	if err != nil {
		return fmt.Errorf("the node gave the export %q: %w", uri, err)
	}
	if !u.TLS {
		return nil
	}
	if g.tlsDir == "" {
		return usageErrorf("%s is served over TLS: pass --tls-dir DIR (or set REPLCTL_TLS_DIR), the directory replctl certs init wrote, whose %s/ holds the NBD client's certificate", uri, pki.NBDClientDir)
	}
	if _, err := pki.LoadNBDClient(g.tlsDir); err != nil {
		return usageErrorf("--tls-dir %s: the NBD client's certificate: %v; point --tls-dir at the directory replctl certs init wrote (with %s/)", g.tlsDir, err, pki.NBDClientDir)
	}
	return nil
}

// notPrimaryError: replctl mount asked a node that is not the volume's primary.
type notPrimaryError struct {
	Volume, Here, Role, Primary string
	// PrimaryAddr is the primary's control address ("" when unknown); Retry the command
	// that mounts there (replctl mount's, --addr PrimaryAddr).
	PrimaryAddr, Retry string
}

func (e *notPrimaryError) Error() string {
	here := fmt.Sprintf("%s is %s on %s (the node at --addr)", e.Volume, e.Role, e.Here)
	if e.Role == "" {
		here = fmt.Sprintf("%s holds no copy of %s (it is the node at --addr)", e.Here, e.Volume)
	}
	if e.Primary == "" {
		return here + " and it has no primary now: make one primary (replctl primary " + e.Volume + " --node NODE), then run replctl mount there"
	}
	switch {
	case e.Retry != "":
		return fmt.Sprintf("%s: its primary is %s; run replctl mount on %s: %s", here, e.Primary, e.Primary, e.Retry)
	case e.PrimaryAddr != "":
		return fmt.Sprintf("%s: its primary is %s; run replctl mount on %s (--addr %s)", here, e.Primary, e.Primary, e.PrimaryAddr)
	}
	return fmt.Sprintf("%s: its primary is %s; run replctl mount on %s", here, e.Primary, e.Primary)
}

// mountTarget decides from the status of the node at --addr whether volume may be mounted
// there: its export's URI; or waitFor, why to wait (it is the primary and does not serve
// yet); or an error (an unknown volume, a node that is not its primary).
func mountTarget(st *transport.ClusterStatus, volume string) (uri, waitFor string, err error) {
	if err := checkNames(st, volume, ""); err != nil {
		return "", "", err
	}
	var vs *transport.VolumeStatus
	for i := range st.Volumes {
		if st.Volumes[i].Name == volume {
			vs = &st.Volumes[i]
		}
	}
	var here *transport.ReplicaStatus
	for i := range vs.Replicas {
		if vs.Replicas[i].Node == st.From {
			here = &vs.Replicas[i]
		}
	}
	if vs.Primary != st.From || here == nil {
		role := ""
		if here != nil {
			role = here.Role
		}
		np := &notPrimaryError{Volume: volume, Here: st.From, Role: role, Primary: vs.Primary}
		for _, n := range st.Nodes {
			if n.Name == vs.Primary {
				np.PrimaryAddr = n.Control
			}
		}
		return "", "", np
	}
	if vs.NBDURI == "" {
		why := here.Reason
		if why == "" {
			why = "disk " + here.Disk + ", " + here.Replication
		}
		return "", fmt.Sprintf("%s is primary on %s but does not serve IO yet (%s)", volume, st.From, why), nil
	}
	return vs.NBDURI, "", nil
}

// listMounts prints the mounts replctl mount made on this host.
func listMounts(cmd *cobra.Command, reg volmount.Registry) error {
	recs, err := reg.List()
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	if len(recs) == 0 {
		fmt.Fprintf(w, "no mounts made by replctl mount (records in %s)\n", reg.Dir)
		return nil
	}
	t := &table{}
	t.add(plain("DIR"), plain("VOLUME"), plain("FSTYPE"), plain("DEVICE"), plain("VIA"), plain("EXPORT"), plain("PRIMARY"), plain("HELPER"))
	for _, r := range recs {
		helper := "gone"
		if r.Helper.Alive() {
			helper = fmt.Sprintf("pid %d", r.Helper.PID)
		}
		state, dir := r.FSType, r.Dir
		switch {
		case r.Attached:
			state, dir = "attached: replctl detach "+r.Volume, "-"
		case !r.Mounted:
			state = "not mounted: replctl umount " + r.Dir
		}
		primary, export := "-", r.Export
		if r.Claim != nil && r.Claim.Node != "" {
			primary = r.Claim.Node
		}
		if r.Follow {
			primary = primary + " (following)"
			if f, err := reg.Following(r.Dir); err == nil && f != nil {
				primary, export = f.Primary+" (following)", f.Export
			}
		}
		t.add(plain(dir), plain(r.Volume), plain(state), plain(r.Device), plain(string(r.Via)), plain(export), plain(primary), plain(helper))
	}
	t.render(w, palette{})
	return nil
}

func newUmount() *cobra.Command {
	var runDir string
	cmd := &cobra.Command{
		Use:   "umount DIR",
		Short: "Unmount what replctl mount mounted on DIR and detach the volume",
		Long: `Undo replctl mount DIR, in order: unmount the file system (which writes it out
and flushes the volume), detach the loop device once nothing else uses it (a
probe that holds it open is waited for, up to 30 s), stop the helper process (it
flushes and disconnects; with the kernel's driver it disconnects /dev/nbdN).
Something replctl mount did not mount on DIR is refused; a DIR where nothing is
mounted is nothing to do. A step that fails stops it, saying why, what is left
and to run replctl umount DIR again once the cause is gone.

Then it gives the volume's claim back to the primary, at the address replctl
mount used: another host may mount the volume from then on. Undoing the mount
asks no node, so a failover's on_demote may run it when the volume is no longer
served here; a claim it cannot give back (the primary is down or changed) is
said, and lapses by itself --io-timeout after the mount's connections closed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			abs, err := filepath.Abs(args[0])
			if err != nil {
				return usageErrorf("DIR %q: %v", args[0], err)
			}
			dir := abs
			if resolved, err := filepath.EvalSymlinks(abs); err == nil {
				dir = resolved
			}
			if os.Geteuid() != 0 {
				return errors.New("replctl umount unmounts a file system and detaches a device: run it as root")
			}
			reg := volmount.Registry{Dir: runDir}
			following, _ := reg.Following(dir)
			rec, err := volmount.Unmount(cmd.Context(), reg, dir)
			if err != nil {
				return err
			}
			if rec == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: nothing mounted there; nothing to do\n", dir)
				return nil
			}
			claim := ""
			if rec.Claim != nil {
				claim = "; " + giveBack(cmd.Context(), rec, following)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s unmounted; %s detached (%s)%s\n", dir, rec.Volume, rec.Export, claim)
			return nil
		},
	}
	runDirFlag(cmd, &runDir)
	return cmd
}

// newMountHelper is the helper process of replctl mount (hidden): the NBD client, and the
// FUSE server of the export's file. Its arguments are volmount.HelperConfig's.
func newMountHelper() *cobra.Command {
	return &cobra.Command{
		Use:                mountHelperCommand,
		Short:              "The process that serves a mount of replctl mount (started by it)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			os.Exit(volmount.RunHelper(args, findPrimaryFor))
			return nil
		},
	}
}
