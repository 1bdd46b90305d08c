// Package contain keeps every process an upstream child starts inside the
// gateway's reach, however it tries to leave: a grandchild that calls
// setsid (double-forked or not) leaves its process group, which is what
// the gateway and its reaper otherwise kill.
//
// Setup, called once by serve, makes the gateway a child subreaper
// (PR_SET_CHILD_SUBREAPER): an orphan in the gateway's subtree is
// re-parented to the gateway, not to PID 1, and the gateway reaps it, and
// kills every such orphan when an upstream child ends (KillOrphans) and
// when it stops. Where cgroup v2 is mounted and the gateway's cgroup is
// writable, each child also starts in a cgroup of its own (NewGroup,
// clone3 CLONE_INTO_CGROUP: no moment outside it), which Group.Kill ends
// with cgroup.kill, and which the reaper process kills if the gateway
// dies, SIGKILL included. Mode says which containment is in force; serve
// logs it at start and /readyz shows it.
//
// What holds where (docs/hostile-peers.md): with a cgroup, every
// descendant ends with its child, with the gateway's stop and with the
// gateway's death; with the subreaper alone, every orphan ends when any
// child ends and when the gateway stops, but one whose parent has not
// exited is still a descendant of its child (killed with it only if it
// stayed in the child's group), and after SIGKILL of the gateway the
// orphans go to the next subreaper or PID 1 (nothing that dies can act on
// its own death; the child's parent-death signal reaches the child only).
package contain

// Containment modes, as /readyz and the startup log name them.
const (
	ModeNone      = "none"             // not Linux, or Setup not called or refused
	ModeSubreaper = "subreaper"        // orphans come back to the gateway
	ModeCgroup    = "cgroup+subreaper" // and each child has a cgroup of its own
)

// Info is the containment in force.
type Info struct {
	Mode string `json:"mode"`
	// Cgroup is the directory under which each child gets its cgroup
	// (ModeCgroup), or "".
	Cgroup string `json:"cgroup,omitempty"`
	// Why says why no cgroup is used, when Mode is not ModeCgroup.
	Why string `json:"why,omitempty"`
}

// String is Info for a log line.
func (i Info) String() string {
	switch {
	case i.Mode == ModeCgroup:
		return i.Mode + " (a cgroup per child under " + i.Cgroup + ")"
	case i.Why != "":
		return i.Mode + " (no cgroup: " + i.Why + ")"
	}
	return i.Mode
}
