//go:build !linux

package upstream

// waitExited cannot wait without reaping here: the child's group is not
// killed when it exits, only by Stop while it runs.
func waitExited(int) bool { return false }
