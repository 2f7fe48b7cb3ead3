package backing

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/multipath"
)

// Open opens one node's backing LUN dc of volume vc, which must hold
// size bytes (RequiredSize): a plain file or device, or a multipath device
// over several labelled paths. openDisk and openPath open a plain disk and
// one path of a multipath disk; nil means OpenDisk and
// multipath.OpenFilePath. Path state changes go to log.
func Open(vc config.VolumeConfig, dc config.DiskConfig, size int64, preferred int, openDisk func(path string, size int64) (Disk, error), openPath func(config.PathConfig) (multipath.Path, error), log *slog.Logger) (Disk, *multipath.Device, error) {
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
		Preferred:     preferred,
		CheckInterval: time.Duration(dc.CheckInterval),
		IOTimeout:     time.Duration(dc.IOTimeout),
		NoPathRetry:   dc.NoPathRetry,
		Label:         true,

		ReinstateHoldoff: time.Duration(dc.ReinstateHoldoff),
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
