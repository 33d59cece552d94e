// Package core is the one place nexus's decisions live. It is pure: no os,
// no clock, no I/O, no randomness. What the edge has seen (the journal's
// view, liveness, the files present) comes in as values, and each decision
// goes out as a value that the edge carries out, so every rule here is
// tested as a table of cases.
package core
