// Package pid1 makes cmcp its own init when it runs as process 1 (a
// container started without --init). The kernel reparents every orphaned
// process of a PID namespace to its process 1, and only process 1 can reap
// them: a gateway that is process 1 waits for its own children only, so
// every grandchild left behind (npx -> node, a server's double fork, the
// members of a child's group killed when it stops) would stay a zombie
// until the container ends, and the namespace would run out of PIDs.
//
// Run, called first thing by cli.Main, starts cmcp again as its child
// (/proc/self/exe, the same arguments, the same standard streams and the
// same environment with CMCP_INIT_CHILD=1 added, which the child takes out
// again), forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to
// that child, reaps every process the kernel hands it, and exits with the
// child's status (128+n when signal n ended it). It writes one line to
// stderr and nothing to stdout, so `serve --stdio` keeps its connection.
package pid1

// ChildEnv marks the process that process 1 started: it is the program, not
// the init. Run removes it from the environment.
const ChildEnv = "CMCP_INIT_CHILD"
