#!/usr/bin/env bash
# A three-node replvol cluster on this machine, for trying it out: data
# nodes alpha and beta and a witness, each a replnode process of its own,
# with raft and gossip (automatic failover), one volume vol0 on sparse
# files. Run as root (with ip from iproute2), each node lives in a network
# namespace of its own on a bridge, with its own address, as on three
# hosts; otherwise (or with --no-netns) the nodes share 127.0.0.1.
#
#   deploy/local-cluster.sh [start] [--dir DIR] [--size 256MiB] [--tls]
#                           [--no-netns] [--base-port 7800] [--bin DIR]
#   deploy/local-cluster.sh status|wait|env [--dir DIR]
#   deploy/local-cluster.sh kill NODE [--dir DIR]     kill -9 of one node
#   deploy/local-cluster.sh start-node NODE [--dir DIR]
#   deploy/local-cluster.sh stop [--dir DIR]          processes, namespaces,
#                                                     bridge and DIR, all gone
#
# DIR (default $REPLVOL_LOCAL_DIR, else /tmp/replvol-local) holds the
# cluster file, the disks, each node's state and log, and what stop must
# undo. --tls makes every link mutual TLS (replctl certs init); --bin DIR
# takes replnode and replctl from DIR instead of building them (go build).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
NODES=(alpha beta witness)
MARK=.replvol-local-cluster

die() { echo "local-cluster: $*" >&2; exit 1; }
say() { echo "local-cluster: $*" >&2; }

cmd=start
if [[ $# -gt 0 && $1 != -* ]]; then
	cmd=$1
	shift
fi
target=""
if [[ $cmd == kill || $cmd == start-node ]]; then
	[[ $# -gt 0 && $1 != -* ]] || die "$cmd needs a node: alpha, beta or witness"
	target=$1
	shift
	[[ " ${NODES[*]} " == *" $target "* ]] || die "no node $target: the nodes are ${NODES[*]}"
fi

dir=${REPLVOL_LOCAL_DIR:-/tmp/replvol-local}
size=256MiB
tls=0
netns=auto
base_port=7800
bin=""
while [[ $# -gt 0 ]]; do
	case $1 in
	--dir) dir=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--tls) tls=1; shift ;;
	--no-netns) netns=no; shift ;;
	--base-port) base_port=$2; shift 2 ;;
	--bin) bin=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
done
mkdir -p "$(dirname "$dir")"
dir=$(cd "$(dirname "$dir")" && pwd)/$(basename "$dir")

ipbin=$(PATH="$PATH:/usr/sbin:/sbin" command -v ip || true)

# load reads what start wrote: the mode, names and addresses.
load() {
	[[ -f $dir/$MARK ]] || die "no local cluster in $dir (start one: deploy/local-cluster.sh start --dir $dir)"
	# shellcheck source=/dev/null
	source "$dir/lab.env"
}

replctl() { "$dir/bin/replctl" ${REPLCTL_TLS_DIR:+--tls-dir "$REPLCTL_TLS_DIR"} "$@"; }

# control NODE: the node's control address.
control() { local v="CONTROL_$1"; echo "${!v}"; }

# pid_alive PIDFILE: the node whose pid the file holds still runs.
# pid_alive PIDFILE: the process runs. A process killed but not yet
# reaped (a zombie, state Z) does not: kill -0 still finds it.
pid_alive() {
	[[ -f $1 ]] || return 1
	local pid state
	pid=$(cat "$1")
	kill -0 "$pid" 2>/dev/null || return 1
	state=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
	[[ -n $state && $state != Z ]]
}

# launch NODE: starts the node in the background, in its namespace when
# there is one, in a session of its own (it outlives this script), with
# its pid in pids/NODE.
launch() {
	local n=$1 pidfile="$dir/pids/$1"
	pid_alive "$pidfile" && die "$n runs already (pid $(cat "$pidfile"))"
	local run=(sh -c 'echo $$ >"$0"; exec "$@"' "$pidfile"
		"$dir/bin/replnode" --config "$dir/cluster.yaml" --node "$n" --state-dir "$dir/state/$n")
	if [[ $MODE == netns ]]; then
		run=("$ipbin" netns exec "$NS_PREFIX-$n" "${run[@]}")
	fi
	rm -f "$pidfile"
	setsid "${run[@]}" </dev/null >>"$dir/logs/$n.log" 2>&1 &
	for _ in $(seq 50); do
		[[ -s $pidfile ]] && return 0
		sleep 0.1
	done
	die "$n did not start: see $dir/logs/$n.log"
}

# wait_healthy [SECONDS]: until replctl status --check says nothing needs
# attention (a primary serves, every replica UpToDate, quorum).
wait_healthy() {
	local limit=${1:-90} addr
	for ((i = 0; i < limit * 2; i++)); do
		for n in "${NODES[@]}"; do
			pid_alive "$dir/pids/$n" || continue
			addr=$(control "$n")
			if replctl --addr "$addr" --timeout 3s status --check >/dev/null 2>&1; then
				return 0
			fi
			break
		done
		sleep 0.5
	done
	replctl --addr "$addr" --timeout 3s status --check >&2 || true
	die "the cluster is not healthy after ${limit}s (logs in $dir/logs)"
}

# export_uri: the NBD URI of vol0 at its primary now.
export_uri() {
	local n out
	for n in "${NODES[@]}"; do
		pid_alive "$dir/pids/$n" || continue
		if out=$(replctl --addr "$(control "$n")" --timeout 3s status vol0 2>/dev/null); then
			grep -o 'nbds\{0,1\}://[^ ]*' <<<"$out" | head -1
			return 0
		fi
	done
	return 1
}

# size_bytes SIZE: replvol's sizes in bytes (K, M, G, T, KiB ... TiB are
# binary, KB ... TB decimal; whole numbers only here).
size_bytes() {
	[[ $1 =~ ^([0-9]+)([KMGT]?)(i?B?)$ ]] || die "--size $1: give a whole number with K, M, G, T, KiB ... TiB or KB ... TB"
	local n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]} suffix=${BASH_REMATCH[3]} base=1024
	[[ $suffix == B ]] && base=1000
	case $unit in
	K) n=$((n * base)) ;;
	M) n=$((n * base * base)) ;;
	G) n=$((n * base * base * base)) ;;
	T) n=$((n * base * base * base * base)) ;;
	esac
	echo "$n"
}

# free_subnet: X such that 10.79.X.0/24 is in no address or route here.
free_subnet() {
	local used x
	used=$("$ipbin" -o -4 addr show; "$ipbin" -4 route show table all)
	for _ in $(seq 200); do
		x=$((RANDOM % 256))
		grep -qF "10.79.$x." <<<"$used" || { echo "$x"; return 0; }
	done
	die "no free 10.79.X.0/24 subnet on this host"
}

# teardown_net removes the namespaces (killing what still runs in them:
# only this cluster's nodes live there), the veths and the bridge.
teardown_net() {
	[[ ${MODE:-} == netns ]] || return 0
	local n i=0
	for n in "${NODES[@]}"; do
		if [[ -e /run/netns/$NS_PREFIX-$n ]]; then
			for pid in $("$ipbin" netns pids "$NS_PREFIX-$n" 2>/dev/null); do
				kill -9 "$pid" 2>/dev/null || true
			done
			"$ipbin" netns del "$NS_PREFIX-$n" 2>/dev/null || true
		fi
	done
	for n in "${NODES[@]}"; do
		# The host end goes with the namespace's end, asynchronously.
		for _ in $(seq 50); do
			"$ipbin" link show dev "${LINK_PREFIX}h$i" >/dev/null 2>&1 || break
			sleep 0.1
		done
		"$ipbin" link del "${LINK_PREFIX}h$i" >/dev/null 2>&1 || true
		i=$((i + 1))
	done
	"$ipbin" link del "$BRIDGE" >/dev/null 2>&1 || true
}

start() {
	if [[ -f $dir/$MARK ]]; then
		load
		for n in "${NODES[@]}"; do
			pid_alive "$dir/pids/$n" && die "a local cluster runs in $dir already (deploy/local-cluster.sh stop --dir $dir)"
		done
		die "$dir holds a stopped local cluster: deploy/local-cluster.sh stop --dir $dir removes it first"
	fi
	[[ ! -e $dir || -z $(ls -A "$dir") ]] || die "$dir exists and is not a local cluster's: give another --dir"
	if [[ $netns == auto ]]; then
		if [[ $(id -u) -eq 0 && -n $ipbin ]]; then netns=yes; else netns=no; fi
	fi
	if [[ $netns == yes && ($(id -u) -ne 0 || -z $ipbin) ]]; then
		die "network namespaces need root and ip (iproute2)"
	fi
	mkdir -p "$dir"/{bin,disks,state,logs,pids}
	touch "$dir/$MARK"
	# From here on a failure undoes what was made.
	trap 'say "start failed; removing what it made"; stop_all >/dev/null 2>&1 || true' EXIT

	if [[ -n $bin ]]; then
		cp "$bin/replnode" "$bin/replctl" "$dir/bin/"
	else
		say "building replnode and replctl (go build)"
		(cd "$repo" && go build -o "$dir/bin/" ./cmd/replnode ./cmd/replctl)
	fi

	local ips=() ports=() id=""
	if [[ $netns == yes ]]; then
		id=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
		local x
		x=$(free_subnet)
		{
			echo "MODE=netns"
			echo "NS_PREFIX=rvlc$id"
			echo "BRIDGE=rvlc$id"
			echo "LINK_PREFIX=rvlc$id"
			echo "SUBNET=10.79.$x.0/24"
			echo "HOST_IP=10.79.$x.254"
		} >"$dir/lab.env"
		# shellcheck source=/dev/null
		source "$dir/lab.env"
		"$ipbin" link add "$BRIDGE" type bridge
		"$ipbin" addr add "$HOST_IP/24" dev "$BRIDGE"
		"$ipbin" link set "$BRIDGE" up
		local i=0
		for n in "${NODES[@]}"; do
			local ns="$NS_PREFIX-$n" ip="10.79.$x.$((i + 1))"
			"$ipbin" netns add "$ns"
			"$ipbin" link add "${LINK_PREFIX}h$i" type veth peer name "${LINK_PREFIX}p$i"
			"$ipbin" link set "${LINK_PREFIX}p$i" netns "$ns"
			"$ipbin" link set "${LINK_PREFIX}h$i" master "$BRIDGE"
			"$ipbin" link set "${LINK_PREFIX}h$i" up
			"$ipbin" -n "$ns" link set "${LINK_PREFIX}p$i" name eth0
			"$ipbin" -n "$ns" addr add "$ip/24" dev eth0
			"$ipbin" -n "$ns" link set eth0 up
			"$ipbin" -n "$ns" link set lo up
			ips+=("$ip")
			ports+=(7800)
			i=$((i + 1))
		done
	else
		echo "MODE=loopback" >"$dir/lab.env"
		MODE=loopback
		local i=0
		for n in "${NODES[@]}"; do
			ips+=(127.0.0.1)
			ports+=($((base_port + 10 * i)))
			i=$((i + 1))
		done
	fi

	# The cluster file: every node a raft voter, the witness without disks.
	local f="$dir/cluster.yaml" i=0
	echo "# written by deploy/local-cluster.sh" >"$f"
	echo "nodes:" >>"$f"
	for n in "${NODES[@]}"; do
		local ip=${ips[$i]} p=${ports[$i]}
		echo "CONTROL_$n=$ip:$p" >>"$dir/lab.env"
		{
			echo "  - name: $n"
			if [[ $n == witness ]]; then
				echo "    role: witness"
			fi
			echo "    control: $ip:$p"
			if [[ $n != witness ]]; then
				echo "    replication: $ip:$((p + 1))"
				echo "    nbd: $ip:$((p + 2))"
			fi
			echo "    raft: $ip:$((p + 3))"
			echo "    gossip: $ip:$((p + 4))"
			echo "    state_dir: $dir/state/$n"
		} >>"$f"
		i=$((i + 1))
	done
	cat >>"$f" <<-EOF
	failover: auto
	volumes:
	  - name: vol0
	    size: $size
	    protocol: C
	    primary: alpha
	    disks:
	      alpha: $dir/disks/alpha.img
	      beta: $dir/disks/beta.img
	EOF
	# Sparse files, larger than the volume by room for the metadata.
	local bytes
	bytes=$(size_bytes "$size")
	for n in alpha beta; do
		truncate -s $((bytes + 64 * 1024 * 1024)) "$dir/disks/$n.img"
	done
	if ((tls)); then
		"$dir/bin/replctl" certs init --config "$f" --dir "$dir/tls" >/dev/null
		cat >>"$f" <<-EOF
		tls:
		  ca: $dir/tls/ca.crt
		  cert: $dir/tls/{node}.crt
		  key: $dir/tls/{node}.key
		  gossip_key: $dir/tls/gossip.key
		  nbd: required
		EOF
		echo "REPLCTL_TLS_DIR=$dir/tls" >>"$dir/lab.env"
	fi
	load
	for n in "${NODES[@]}"; do
		launch "$n"
	done
	wait_healthy 120
	trap - EXIT

	local uri
	uri=$(export_uri)
	local how="on 127.0.0.1"
	[[ $MODE == netns ]] && how="each in network namespace $NS_PREFIX-NODE, on bridge $BRIDGE ($SUBNET)"
	cat <<-EOF
	replvol local cluster in $dir: alpha, beta and witness, $how
	  export:  $uri${REPLCTL_TLS_DIR:+?tls-certificates=$REPLCTL_TLS_DIR/nbd-client}
	  status:  $dir/bin/replctl --addr $CONTROL_alpha${REPLCTL_TLS_DIR:+ --tls-dir $REPLCTL_TLS_DIR} status
	           (or: $0 status --dir $dir); the page: http${REPLCTL_TLS_DIR:+s}://$CONTROL_alpha/
	  logs:    $dir/logs/NODE.log
	  fail:    $0 kill alpha --dir $dir       (kill -9: beta takes over)
	           $0 start-node alpha --dir $dir (it rejoins and resyncs)
	  stop:    $0 stop --dir $dir
	EOF
}

# stop_all stops every node (SIGTERM, then SIGKILL after 10 s), removes
# the network and the directory.
stop_all() {
	local n pidfile pid
	for n in "${NODES[@]}"; do
		pidfile="$dir/pids/$n"
		pid_alive "$pidfile" && kill -TERM "$(cat "$pidfile")" 2>/dev/null || true
	done
	for n in "${NODES[@]}"; do
		pidfile="$dir/pids/$n"
		[[ -f $pidfile ]] || continue
		pid=$(cat "$pidfile")
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			say "$n (pid $pid) did not stop in 10s: SIGKILL"
			kill -9 "$pid" 2>/dev/null || true
		fi
	done
	teardown_net
	[[ -f $dir/$MARK ]] && rm -rf "$dir"
}

case $cmd in
start) start ;;
stop)
	load
	stop_all
	echo "local-cluster: stopped; $dir removed"
	;;
status)
	load
	for n in "${NODES[@]}"; do
		if pid_alive "$dir/pids/$n"; then
			exec "$dir/bin/replctl" ${REPLCTL_TLS_DIR:+--tls-dir "$REPLCTL_TLS_DIR"} --addr "$(control "$n")" status
		fi
	done
	die "no node of $dir runs"
	;;
wait)
	load
	wait_healthy 120
	export_uri
	;;
env)
	load
	cat "$dir/lab.env"
	echo "DIR=$dir"
	;;
kill)
	load
	pid_alive "$dir/pids/$target" || die "$target does not run"
	kill -9 "$(cat "$dir/pids/$target")"
	# Gone before this returns: a start-node right after finds it dead.
	for _ in $(seq 100); do
		pid_alive "$dir/pids/$target" || break
		sleep 0.1
	done
	pid_alive "$dir/pids/$target" && die "$target (pid $(cat "$dir/pids/$target")) still runs 10 s after kill -9"
	echo "local-cluster: killed $target (kill -9)"
	;;
start-node)
	load
	launch "$target"
	echo "local-cluster: started $target"
	;;
*) die "unknown command $cmd: start, stop, status, wait, env, kill NODE, start-node NODE" ;;
esac
