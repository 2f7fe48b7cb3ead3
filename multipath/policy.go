package multipath

import "fmt"

// Policy chooses the path of each IO.
type Policy uint8

const (
	// Failover sends every IO to the preferred path; the others stand by.
	Failover Policy = iota
	// RoundRobin rotates over the active paths, RRMinIO IOs on a path
	// before it switches.
	RoundRobin
	// QueueLength sends each IO to the active path with the fewest IOs in
	// flight.
	QueueLength
	// ServiceTime sends each IO to the active path with the least
	// (bytes in flight + this IO) / observed throughput.
	ServiceTime
	// ActiveRead balances reads as QueueLength does and sends every write
	// to the preferred path, so that writes keep their order.
	ActiveRead
)

var policyNames = [...]string{"failover", "round-robin", "queue-length", "service-time", "active-read"}

func (p Policy) String() string {
	if int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("Policy(%d)", p)
}

// ParsePolicy reads a policy name as String prints it.
func ParsePolicy(s string) (Policy, error) {
	for i, name := range policyNames {
		if s == name {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown multipath policy %q: want one of failover, round-robin, queue-length, service-time, active-read", s)
}

// Health is whether a path may carry IO.
type Health uint8

const (
	// Healthy paths carry IO as the policy says.
	Healthy Health = iota
	// Standby paths have recovered and wait for failback (manual, or a
	// delay). They carry IO only when no path is Healthy.
	Standby
	// Failed paths carry no IO.
	Failed
)

func (h Health) String() string {
	switch h {
	case Healthy:
		return "healthy"
	case Standby:
		return "standby"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Health(%d)", h)
}

// PathState is what an operator sees of a path, with gmultipath's names.
type PathState uint8

const (
	// Active paths carry IO.
	Active PathState = iota
	// Passive paths work but carry no IO while an Active path works.
	Passive
	// Fail paths carry no IO: an IO or a probe failed, or the operator
	// failed them.
	Fail
)

func (s PathState) String() string {
	switch s {
	case Active:
		return "ACTIVE"
	case Passive:
		return "PASSIVE"
	case Fail:
		return "FAIL"
	}
	return fmt.Sprintf("PathState(%d)", s)
}

// Direction is whether an IO reads or changes the LUN. Sync and Zero
// count as writes.
type Direction uint8

const (
	Read Direction = iota
	Write
)

// PathView is what a selector knows about one path.
type PathView struct {
	Health Health
	// Group is the index of the path's group (controller or HBA). The
	// preferred path's group is the active group: IO stays in it while
	// it has a Healthy path, as dm-multipath keeps IO in its active
	// priority group.
	Group         int
	InFlight      int   // IOs issued and not completed
	InFlightBytes int64 // their bytes
	// Throughput is the path's observed bytes per second while busy, an
	// EWMA; 0 until measured.
	Throughput float64
}

// Choice is the rest of a selector's input: the IO, and the device's
// selection state.
type Choice struct {
	Policy    Policy
	Direction Direction
	Size      int64 // bytes of this IO
	Preferred int   // the failover and write path; its group is the active group
	Last      int   // the path chosen for the previous IO
	IOsOnLast int   // IOs sent to Last since the selector switched to it
	RRMinIO   int   // round-robin: IOs on a path before switching
}

// tier is the set of paths a selector may choose from, best first: the
// Healthy paths of the active group, else any Healthy path, else the
// Standby paths.
type tier uint8

const (
	tierNone tier = iota
	tierGroup
	tierHealthy
	tierStandby
)

func (t tier) admits(v *PathView, group int) bool {
	switch t {
	case tierGroup:
		return v.Health == Healthy && v.Group == group
	case tierHealthy:
		return v.Health == Healthy
	case tierStandby:
		return v.Health == Standby
	}
	return false
}

// eligibleTier returns the best non-empty tier and the active group.
func eligibleTier(paths []PathView, preferred int) (tier, int) {
	group := -1
	if preferred >= 0 && preferred < len(paths) {
		group = paths[preferred].Group
	}
	healthy, standby := false, false
	for i := range paths {
		switch paths[i].Health {
		case Healthy:
			if paths[i].Group == group {
				return tierGroup, group
			}
			healthy = true
		case Standby:
			standby = true
		}
	}
	switch {
	case healthy:
		return tierHealthy, group
	case standby:
		return tierStandby, group
	}
	return tierNone, group
}

// Choose returns the index of the path for one IO, or -1 when no path
// may carry it. It is pure and allocates nothing. Ties go to the first
// candidate after c.Last in ring order, so equal paths alternate.
func Choose(paths []PathView, c *Choice) int {
	t, group := eligibleTier(paths, c.Preferred)
	if t == tierNone {
		return -1
	}
	switch {
	case c.Policy == Failover, c.Policy == ActiveRead && c.Direction == Write:
		return chooseFailover(paths, t, group, c.Preferred)
	case c.Policy == RoundRobin:
		return chooseRoundRobin(paths, t, group, c)
	case c.Policy == QueueLength, c.Policy == ActiveRead:
		return chooseQueueLength(paths, t, group, c.Last)
	case c.Policy == ServiceTime:
		return chooseServiceTime(paths, t, group, c.Last, c.Size)
	}
	panic(fmt.Sprintf("multipath: unknown policy %d", c.Policy))
}

// nextIn returns the first path after from, in ring order, that t admits;
// from itself comes last.
func nextIn(paths []PathView, t tier, group, from int) int {
	n := len(paths)
	for k := 1; k <= n; k++ {
		i := (from + k) % n
		if i < 0 {
			i += n
		}
		if t.admits(&paths[i], group) {
			return i
		}
	}
	return -1
}

func inRange(paths []PathView, i int) bool { return i >= 0 && i < len(paths) }

func chooseFailover(paths []PathView, t tier, group, preferred int) int {
	if inRange(paths, preferred) && t.admits(&paths[preferred], group) {
		return preferred
	}
	return nextIn(paths, t, group, preferred)
}

func chooseRoundRobin(paths []PathView, t tier, group int, c *Choice) int {
	if inRange(paths, c.Last) && c.IOsOnLast < c.RRMinIO && t.admits(&paths[c.Last], group) {
		return c.Last
	}
	return nextIn(paths, t, group, c.Last)
}

func chooseQueueLength(paths []PathView, t tier, group, last int) int {
	n, best := len(paths), -1
	for k := 1; k <= n; k++ {
		i := ((last+k)%n + n) % n
		v := &paths[i]
		if !t.admits(v, group) {
			continue
		}
		if best < 0 || v.InFlight < paths[best].InFlight {
			best = i
		}
	}
	return best
}

func chooseServiceTime(paths []PathView, t tier, group, last int, size int64) int {
	n := len(paths)
	// Until every candidate's throughput is known, weigh them equally
	// (dm-multipath's relative_throughput defaults to 1 for all paths).
	measured := true
	for i := range paths {
		if t.admits(&paths[i], group) && paths[i].Throughput <= 0 {
			measured = false
			break
		}
	}
	best := -1
	for k := 1; k <= n; k++ {
		i := ((last+k)%n + n) % n
		v := &paths[i]
		if !t.admits(v, group) {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := &paths[best]
		vLoad, bLoad := float64(v.InFlightBytes+size), float64(b.InFlightBytes+size)
		if measured {
			// vLoad/v.Throughput < bLoad/b.Throughput, without dividing.
			if vLoad*b.Throughput < bLoad*v.Throughput {
				best = i
			}
		} else if vLoad < bLoad {
			best = i
		}
	}
	return best
}

// NextPreferred returns the path to prefer when the preferred one may no
// longer carry IO: a Healthy path of its group, else any Healthy path,
// else a Standby path, in ring order after preferred. It returns
// preferred itself when it is still the best choice, and -1 when no path
// may carry IO.
func NextPreferred(paths []PathView, preferred int) int {
	t, group := eligibleTier(paths, preferred)
	if t == tierNone {
		return -1
	}
	return chooseFailover(paths, t, group, preferred)
}

// Rotate returns the path that gmultipath's rotate makes active: the next
// Healthy path after preferred in ring order, whatever its group;
// preferred itself when no other path is Healthy.
func Rotate(paths []PathView, preferred int) int {
	if i := nextIn(paths, tierHealthy, -1, preferred); i >= 0 {
		return i
	}
	return preferred
}

// StateOf is the state an operator sees for path i.
func StateOf(paths []PathView, policy Policy, preferred, i int) PathState {
	switch paths[i].Health {
	case Failed:
		return Fail
	case Standby:
		return Passive
	}
	if policy == Failover {
		if i == preferred {
			return Active
		}
		return Passive
	}
	t, group := eligibleTier(paths, preferred)
	if t.admits(&paths[i], group) {
		return Active
	}
	return Passive
}
