// Command replbench compares replvol's NBD data path with two reference
// servers in one run and prints one table of medians and ratios.
//
// Targets, all driven through NBD by fio's nbd engine (libnbd):
//
//   - replvol-nodes (nodes.go): replvol as users run it, two replnode
//     processes alpha (primary, serving NBD) and beta, each with its own
//     preallocated disk, protocol C, internal metadata, on 127.0.0.1 with
//     ports picked free, no raft and no witness (the failover phase's
//     cluster, fvCluster, with its data nodes only). Before every run both
//     replicas are in sync.
//   - replvol-nodes-nosums: the same with `checksums: off` (metadata laid
//     out without the checksum area): what checksums at rest cost, as
//     ratios of replvol-nodes to it from the same run (issue29.go; goals
//     >= 0.9x on 8K random writes, >= 0.95x on 1M sequential writes and
//     on 8K random reads). Once the fio runs are done, the scrub phase
//     (scrub.go, --scrub) times `replctl scrub` at full rate on its
//     alpha against a plain sequential read of the same backing file,
//     both from a dropped page cache, rounds alternating: goal >= 0.8x.
//   - replvol-nodes3: replvol-nodes with a third replnode process, gamma
//     (nodes.go): alpha replicates to beta and gamma, protocol C; all
//     three replicas in sync before every run. Its 8K random write IOPS
//     over replvol-nodes' from the same rounds is issue 31's "3 replicas
//     >= 0.85x of 2".
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
//   - floor: "minimal replicated write (Go, no metadata)", built from
//     cmd/replbench/floor: an NBD primary that pwrites each write, frames it
//     to a replica process that pwrites and acknowledges, and replies
//     after the acknowledgement. The machine's and the language's limit
//     beside every figure, not a competitor.
//
// Workloads: 8K random write at iodepth 16, 1M sequential write at iodepth 4,
// 8K random read at iodepth 16, and 8K random write at iodepth 1 (its
// latency, p50 in the table and p99 beside it) on replvol-nodes, nbdkit and
// the floor. Every target's images are preallocated and
// filled with one sequential write over the benchmark span before round one,
// so reads return real data.
//
// Page cache (pagecache.go, --page-cache): nbdkit writes its file in the
// sizes fio sends and replvol its disk in 64 KiB pieces, so a 1 MiB fill
// leaves nbdkit's file in large folios that every later 8K write walks
// (issue 19). Under drop (the default) the fill writes 64 KiB blocks into
// every target, and before every measured run every regular file of every
// target is written back (fdatasync) and dropped from the page cache
// (POSIX_FADV_DONTNEED, per file: no root, nothing else on the machine
// dropped), mincore counting what stayed resident: every run, reads
// included, starts with none of any target's data cached. keep is the
// old state (1 MiB fill, `sync` between runs) for comparison. The table's
// header says which.
//
// Each round runs every workload on every target
// back to back (the target order rotates per round); the table shows the
// median per cell, the ratios replvol/nbdkit and replvol/quorum, and PASS or
// MISS for the project's goals (never a hard failure):
//
//	8K randwrite >= 0.4x nbdkit and >= 1.5x quorum; 8K randread >= 0.8x nbdkit.
//
// Every timed run also measures what each server process spent per IO
// (cost.go): CPU time (/proc/PID/stat), system calls and context
// switches (`perf stat -e raw_syscalls:sys_enter,context-switches -p PID`,
// every thread; where perf is missing or cannot count, the table says
// syscalls were NOT MEASURED and prints n/a, and the switches are
// /proc/PID/task/*/status's, which miss threads that end during a run).
// The cost table shows each process: replvol-nodes' alpha and beta
// separately, replvol-nodes3's alpha, beta and gamma, the demo as one,
// nbdkit, the quorum's nbdkit and qemu-nbd, the floor's primary and
// replica. Below it, issue 31's goals for
// replvol-nodes from the same run (issue31.go): CPU per replicated 8K
// write of both nodes <= 1.5x the floor's; 8K random write qd16 >= 0.6x
// nbdkit; qd1 latency p50 <= 1.3x and p99 <= 1.6x nbdkit's; 3 replicas
// (replvol-nodes3) >= 0.85x of 2 (replvol-nodes) on 8K random writes
// qd16, with the CPU per IO of both beside it; 1M sequential write >=
// 0.45x nbdkit.
//
// Protocols (protocols.go), in the same rounds: the replvol demo also
// runs 8K random write qd16 and 1M sequential write qd4 under protocol A
// (`replctl adjust vol0 --protocol A --on-congestion pull-ahead`), B and
// local-only (`replctl disconnect vol0 --node beta`, reconnected and
// resynced after the run), and 8K random write qd1 under C, A, B and
// local-only for the latency from submission to completion (fio's lat
// percentiles; the nbd engine's clat split is not stable). A second table
// shows each as a ratio to nbdkit from the same rounds, each protocol's
// added p50 and p99 latency over local-only, and for A and B whether the
// peer was seen Ahead and the largest lag; goal: A's 8K random write >=
// 0.8x nbdkit. After each run on the demo the next waits until it is in
// sync again.
//
// After the fio phases and the resync figure, their servers stopped, the
// fresh phase (fresh.go, --fresh) starts, per round, a new replvol demo
// (sparse disks) and nbdkit on a new sparse file of --size, runs 8K random
// write qd16 once on each (nothing prefilled: every write allocates) and
// removes them; it prints the medians and their ratio.
//
// Then the read-balancing phase (readbalance.go) runs replnode processes alpha
// (primary) and beta, each backing file behind a loop device and each
// replnode in a cgroup that caps its reads of that device (--read-throttle
// per disk; cgroup v2 io.max, else v1 blkio; without root, losetup or a
// controller it runs unthrottled on plain files and says so). It reads
// the filled volume with 1M sequential reads at qd8 through NBD under
// read_balancing prefer-local (one replica) and round-robin (nodes
// restarted with the config changed), the page cache dropped before each
// run; goal: round-robin >= 1.5x prefer-local. The cgroups' io stats show
// how much each disk served.
//
// Then the failover phase (failover.go) starts a cluster of replnode
// processes: data nodes alpha and beta and a witness on 127.0.0.1 with
// raft and gossip, a 64 MiB volume. It times --failover-runs automatic
// failovers (kill -9 of the primary's replnode while one client writes
// 4 KiB blocks at queue depth 1 through NBD to whichever node serves → the
// first write the other node acknowledges; the killed node is restarted
// and resynced before the next run, which kills the other node) and as
// many switchovers (`replctl primary` with no client connected → the
// first write the new primary acknowledges on a fresh connection; the
// command's own time is shown too). It prints median, worst and every
// run, and PASS or MISS for the goal: failover median <= 2 s, never over
// 5 s.
//
// Then the idle phase (idle.go, --idle-volumes N, 0 skips) starts replnode
// processes alpha (primary of all) and beta, no raft, with N volumes of
// 16 MiB on sparse files, times how long until every volume is UpToDate,
// Connected and in sync on both (alpha's `replctl status --json`, at most
// 180 s; else it says how many made it), then measures each node's CPU
// over --idle-window (utime+stime of /proc/PID/stat, % of one core) and
// its VmRSS. With --idle-profile PREFIX it also saves alpha's CPU profile
// over the window and its heap profile after it, from its control port's
// /debug/pprof/ (PREFIX.cpu.pprof, PREFIX.heap.pprof).
//
// Last, issue 19's targets (issue19.go), one row each with the measured
// figure, the target, the limit of a 2-core box the issue measured and
// PASS, MISS or n/a (not measured, or not the target's setup: fewer than
// 10 kills, other than 1,000 idle volumes, --page-cache keep): 8K random
// write qd16 protocol C >= 0.6x nbdkit (limit ~0.7x), the same into a
// fresh sparse volume >= 0.55x (~0.7x), 1M sequential write qd4 protocol
// C >= 0.35x (0.37-0.4x) and local-only >= 0.85x (~0.9x), failover median
// <= 1 s and worst <= 1.5 s, 1,000 idle volumes UpToDate within 60 s and
// their primary's node at most 2% of a core and 256 MiB.
//
// With --book FILE (make bench: docs/perf.md) it also writes the book
// (book.go): FILE in markdown (the date; the machine: CPU model, cores,
// kernel, Go, memory; how the page cache was equalised; the targets; every
// table above) and beside it FILE's name with .svg, a plot it draws
// itself: IOPS and 1M MB/s per protocol, 8K qd1 latency p50/p99 per
// protocol, metadata placement (internal vs external), resync against a
// raw copy, and every failover and switchover. make bench appends
// node/multipath's benchmark output to FILE; the plot leaves the
// multipath path count out.
//
// Usage:
//
//	go run ./cmd/replbench [--rounds 3] [--runtime 6s] [--json]
//	    [--targets replvol-nodes,replvol-nodes3,replvol,nbdkit,quorum,floor] [--span 512MiB] [--dir DIR]
//	    [--workloads randwrite-8k,seqwrite-1m,randread-8k,randwrite-8k-qd1]
//	    [--protocols=true] [--read-balancing=true] [--read-throttle 50MiB]
//	    [--failover-runs 10] [--page-cache drop|keep] [--fresh=true]
//	    [--idle-volumes 1000] [--idle-window 20s] [--idle-profile PREFIX] [--book docs/perf.md]
//	    [--nodes-profile PREFIX]
//
// All child processes, loop devices, cgroups and temporary files are
// removed on exit, also on Ctrl-C or SIGTERM.
//
// Its mutexes (the result collectors of protocols.go, failover.go and
// main.go) are leaves: each guards a slice or a map while it is appended
// to.
package main
