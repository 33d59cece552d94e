// Package session owns the policy between one command's connection to a
// state root (control) and the flows it runs (lifecycle): `nexus run` and
// binding sandboxes to a client's run, the ledger sweeps and their actions
// (which may recover only while this process owns the journal), and the
// reaper's fallback when the journal cannot be fully read, and the
// export of the sagas' trace spans when the environment asks for it. It is
// cmd/nexus's one door to the flows (flows.go): the CLI parses and prints
// around these.
package session
