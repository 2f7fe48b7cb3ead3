// Command replbench compares replvol's NBD data path with two reference
// servers in one run and prints one table of medians and ratios.
//
// Targets, all driven through NBD by fio's nbd engine (libnbd):
//
//   - replvol: `replctl demo --dir D --base-port 0 --size 1GiB`, started as a
//     child process from a freshly built cmd/replctl. The first stdout line
//     starting with "nbd://" is the primary's URI; the line "ready" means the
//     cluster serves IO. It is stopped with SIGTERM.
//   - nbdkit: `nbdkit --exit-with-parent -f -p PORT -i 127.0.0.1 file plain.img`,
//     a plain unreplicated server: the ceiling.
//   - quorum: a QEMU quorum mirror (DESIGN.md §8): qemu-nbd serving
//     driver=quorum,vote-threshold=2 over a local raw file and an NBD child
//     served by a second nbdkit. qemu-nbd runs in the foreground as our child
//     instead of --fork so that it is always cleaned up; the block options are
//     the ones DESIGN.md shows (--cache=writeback --aio=threads).
//
// Workloads: 8K random write at iodepth 16, 1M sequential write at iodepth 4,
// 8K random read at iodepth 16. Every target's images are preallocated and
// filled with one sequential write over the benchmark span before round one,
// so reads return real data. Each round runs every workload on every target
// back to back (the target order rotates per round); the table shows the
// median per cell, the ratios replvol/nbdkit and replvol/quorum, and PASS or
// MISS for the project's goals (never a hard failure):
//
//	8K randwrite >= 0.4x nbdkit and >= 1.5x quorum; 8K randread >= 0.8x nbdkit.
//
// After the fio phases (their servers stopped), the failover phase
// (failover.go) starts a cluster of replnode processes: data nodes alpha
// and beta and a witness on 127.0.0.1 with raft and gossip, a 64 MiB
// volume. It times --failover-runs automatic failovers (kill -9 of the
// primary's replnode while one client writes 4 KiB blocks at queue depth 1
// through NBD to whichever node serves → the first write the other node
// acknowledges; the killed node is restarted and resynced before the next
// run, which kills the other node) and as many switchovers (`replctl
// primary` with no client connected → the first write the new primary
// acknowledges on a fresh connection; the command's own time is shown
// too). It prints median, worst and every run, and PASS or MISS for the
// goal: failover median <= 2 s, never over 5 s.
//
// Usage:
//
//	go run ./cmd/replbench [--rounds 3] [--runtime 6s] [--json]
//	    [--targets replvol,nbdkit,quorum] [--span 512MiB] [--dir DIR]
//	    [--failover-runs 10]
//
// All child processes and temporary files are removed on exit, also on
// Ctrl-C or SIGTERM.
package main
