// Package archtest holds ARCHITECTURE.md to the import graph that `go
// list` reports: every package has a row in its table and every arrow its
// picture draws is a real import. It also holds code comments to saying
// what and why (no requirement codes, issue numbers, test names or load
// figures: those live in git and docs/requirements.md), and that map to
// the tests that exist. It has only tests.
package archtest
