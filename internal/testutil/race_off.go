//go:build !race

package testutil

// RaceEnabled: this binary runs under -race.
const RaceEnabled = false
