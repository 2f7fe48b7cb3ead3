package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/replvol/replvol/internal/volmount"
	"github.com/replvol/replvol/transport/nbdclient"
	"github.com/spf13/cobra"
)

func newAttach(g *globals) *cobra.Command {
	var (
		via, runDir     string
		follow, refresh bool
		connections     int
		ioTimeout       time.Duration
		refreshEvery    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "attach VOLUME [--follow] | attach --refresh VOLUME",
		Short: "Attach a volume as a block device on this host, and print the device",
		Long: `Attach VOLUME's export as a raw block device and print its name: /dev/nbdN
through the kernel's nbd driver when /dev/nbd* exists, otherwise a loop device
over a file a helper process serves through FUSE, as replctl mount does, but
with no file system probed, made or mounted. replctl detach DEVICE (or VOLUME)
undoes it. The listing of replctl mount shows attachments too.

As replctl mount, it takes the volume's claim from the primary (a volume is
attached or mounted at most once, on any host); --addr must be the volume's
primary, or, with --follow, any node of the cluster: the helper then follows
the primary when it dies or hands over, sending what the old one did not
answer again, in order (see replctl mount --help; FUSE only).

A volume that grew (replctl resize) reaches an attachment through FUSE,
following or not, by itself: NBD tells no client that an export grew, so the
helper asks the primary every --refresh-every (a handshake that moves no data),
and when it grew it connects again, grows its file and makes the loop device
read its capacity again: the device grows without a detach, and never shrinks.
replctl attach --refresh VOLUME has the helper ask now and waits for its answer
(the CSI driver's NodeExpandVolume runs it); it prints the size the attachment
has then. The kernel's nbd driver keeps the size it was given.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case connections < 1 || connections > nbdclient.MaxConnections:
				return usageErrorf("--connections %d: give 1 to %d", connections, nbdclient.MaxConnections)
			case ioTimeout < 0:
				return usageErrorf("--io-timeout %s: give a duration (0: no timeout)", ioTimeout)
			}
			switch volmount.Via(via) {
			case volmount.ViaAuto, volmount.ViaFUSE:
			case volmount.ViaKernel:
				if follow {
					return usageErrorf("--follow goes with --via fuse or auto: the kernel's nbd driver holds its connections itself and cannot send again what the old primary did not answer")
				}
			default:
				return usageErrorf("--via %q: give auto, kernel or fuse", via)
			}
			if os.Geteuid() != 0 {
				return errors.New("replctl attach attaches a block device: run it as root")
			}
			volume := args[0]
			if refresh {
				return attachRefresh(cmd, volmount.Registry{Dir: runDir}, volume, g.timeout)
			}
			if refreshEvery <= 0 {
				return usageErrorf("--refresh-every %s: give a positive duration", refreshEvery)
			}
			if cmd.Flags().Changed("refresh-every") && volmount.Via(via) == volmount.ViaKernel {
				return usageErrorf("--refresh-every goes with --via fuse or auto: the kernel's nbd driver keeps the size it was given")
			}
			target, err := g.attachTarget(cmd, volume, follow, func(addr string) string {
				return fmt.Sprintf("replctl --addr %s attach %s", shellWord(addr), shellWord(volume))
			})
			if err != nil {
				return err
			}
			rec, err := volmount.Mount(cmd.Context(), target.request(volmount.Request{
				Dir: volmount.AttachKey(volume), Volume: volume, Via: volmount.Via(via), Attach: true,
				Connections: connections, IOTimeout: ioTimeout, Registry: volmount.Registry{Dir: runDir},
				RefreshEvery: refreshEvery,
			}, g.timeout))
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), rec.Device)
			following := ""
			if rec.Follow {
				following = ", following the primary"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%s attached as %s, from %s%s; replctl detach %s undoes it\n", volume, rec.Device, rec.Export, following, rec.Device)
			return nil
		},
	}
	cmd.Flags().StringVar(&via, "via", string(volmount.ViaAuto), "how to attach: auto (kernel when /dev/nbd0 exists, else fuse), kernel or fuse")
	cmd.Flags().IntVar(&connections, "connections", 4, "NBD connections, when the server offers multi-conn")
	cmd.Flags().DurationVar(&ioTimeout, "io-timeout", time.Minute, "fail a request the primary does not answer in this time with an IO error (0: wait for ever); with --follow: the time without a primary")
	cmd.Flags().BoolVar(&follow, "follow", false, "follow the primary: attach from any host, find the new primary when it dies or hands over, and send what it did not answer again")
	cmd.Flags().DurationVar(&refreshEvery, "refresh-every", volmount.DefaultRefreshEvery, "through FUSE: how often to ask the primary whether the volume grew")
	cmd.Flags().BoolVar(&refresh, "refresh", false, "have the helper of VOLUME's attachment ask now whether the volume grew, and print its size then")
	runDirFlag(cmd, &runDir)
	return cmd
}

// attachRefresh is replctl attach --refresh VOLUME.
func attachRefresh(cmd *cobra.Command, reg volmount.Registry, volume string, timeout time.Duration) error {
	ctx := cmd.Context()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	f, err := reg.Refresh(ctx, volmount.AttachKey(volume))
	if errors.Is(err, volmount.ErrNoRecord) {
		return fmt.Errorf("%s is not attached by replctl attach here: nothing to refresh", volume)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(cmd.OutOrStdout(), f.Size)
	if f.RefreshError != "" {
		return unreachableError(fmt.Errorf("%s: the attachment is %d bytes, and the helper could not tell whether the volume grew: %s", volume, f.Size, f.RefreshError))
	}
	return nil
}

func newDetach() *cobra.Command {
	var runDir string
	cmd := &cobra.Command{
		Use:   "detach DEVICE|VOLUME",
		Short: "Detach what replctl attach attached",
		Long: `Undo replctl attach: detach the loop device once nothing uses it (a process
that holds it open is waited for, up to 30 s; a file system mounted on it is
refused), stop the helper process (it flushes and disconnects), remove the
record, and give the volume's claim back to the primary. A device or volume
replctl attach did not attach here is nothing to do.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Geteuid() != 0 {
				return errors.New("replctl detach detaches a block device: run it as root")
			}
			reg := volmount.Registry{Dir: runDir}
			recs, err := reg.List()
			if err != nil {
				return err
			}
			var found *volmount.Record
			for _, r := range recs {
				if r.Attached && (r.Volume == args[0] || (r.Device != "" && r.Device == args[0])) {
					found = r
				}
			}
			if found == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: not attached by replctl attach here; nothing to do\n", args[0])
				return nil
			}
			following, _ := reg.Following(found.Dir)
			rec, err := volmount.Unmount(cmd.Context(), reg, found.Dir)
			if err != nil {
				return err
			}
			if rec == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: nothing attached; nothing to do\n", args[0])
				return nil
			}
			claim := ""
			if rec.Claim != nil {
				claim = "; " + giveBack(cmd.Context(), rec, following)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s detached (%s, %s)%s\n", rec.Device, rec.Volume, rec.Export, claim)
			return nil
		},
	}
	runDirFlag(cmd, &runDir)
	return cmd
}
