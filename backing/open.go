package backing

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/multipath"
)

// OpenOptions say how Open opens a backing LUN. Their zero value opens
// real files and devices on the real clock, and logs nothing.
type OpenOptions struct {
	// Preferred is the multipath device's preferred path (its index).
	Preferred int
	// OpenDisk and OpenPath open a plain disk and one path of a multipath
	// disk; nil means OpenDisk and multipath.OpenFilePath.
	OpenDisk func(path string, size int64) (Disk, error)
	OpenPath func(config.PathConfig) (multipath.Path, error)
	// Log receives the path state changes; nil discards them.
	Log *slog.Logger
	// Clock keeps the multipath device's time (multipath.Config.Clock: its
	// checker, failback, flap damping, no-path queue and IO timeouts);
	// nil is clock.Real().
	Clock clock.Clock
}

// Open opens one node's backing LUN dc of volume vc, which must hold
// size bytes (RequiredSize): a plain file or device, or a multipath device
// over several labelled paths, as o says.
func Open(vc config.VolumeConfig, dc config.DiskConfig, size int64, o OpenOptions) (Disk, *multipath.Device, error) {
	openDisk, openPath, log := o.OpenDisk, o.OpenPath, o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !dc.Multipath() {
		if openDisk == nil {
			openDisk = OpenDisk
		}
		d, err := openDisk(dc.Paths[0].Path, size)
		return d, nil, err
	}
	if openPath == nil {
		openPath = func(pc config.PathConfig) (multipath.Path, error) { return multipath.OpenFilePath(pc.Name, pc.Path) }
	}
	var paths []multipath.Path
	closeAll := func() {
		for _, p := range paths {
			p.Close()
		}
	}
	cfg := multipath.Config{
		RRMinIO:       dc.RRMinIO,
		Preferred:     o.Preferred,
		CheckInterval: time.Duration(dc.CheckInterval),
		IOTimeout:     time.Duration(dc.IOTimeout),
		NoPathRetry:   dc.NoPathRetry,
		Label:         true,

		ReinstateHoldoff: time.Duration(dc.ReinstateHoldoff),
		Clock:            clock.Or(o.Clock),
	}
	if dc.NoPathRetry < 0 {
		cfg.NoPathRetry = multipath.NoPathFail
	}
	if dc.Policy != "" {
		cfg.Policy, _ = multipath.ParsePolicy(dc.Policy)
	}
	if dc.Failback != "" {
		cfg.Failback, _ = multipath.ParseFailback(dc.Failback)
	}
	log = log.With("volume", vc.Name, "part", "multipath")
	cfg.OnChange = func(e multipath.Event) {
		log.Info("path state", "path", e.Path, "state", e.State.String(), "reason", e.Reason)
	}
	for _, pc := range dc.Paths {
		p, err := openPath(pc)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("path %s (%s): %w", pc.Name, pc.Path, err)
		}
		paths = append(paths, p)
		cfg.Groups = append(cfg.Groups, pc.Group)
	}
	dev, err := multipath.Open(paths, cfg)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	if dev.Size() < size {
		dev.Close()
		return nil, nil, fmt.Errorf("the LUN behind %s holds %d usable bytes (after replvol's 4 KiB label) but the volume and its metadata need %d: grow it or shrink the volume", dc.Paths[0].Path, dev.Size(), size)
	}
	return dev, dev, nil
}
