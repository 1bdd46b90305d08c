// Package execimage holds what a stdio upstream's child executes, measured:
// the command's file opened and digested through the descriptor that is
// executed (or a sealed memfd copy of it, kept per path), a "#!" script's
// interpreter, the measure target (a file, or a tree), and the watches that
// re-check, once the child runs, that what it may read by path is still
// what was measured. Package upstream spawns the child from it.
package execimage
