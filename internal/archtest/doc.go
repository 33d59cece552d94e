// Package archtest holds ARCHITECTURE.md to the import graph that `go
// list` reports: every package has a row in its table and every arrow its
// picture draws is a real import. It has only tests.
package archtest
