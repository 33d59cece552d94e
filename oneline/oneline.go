// Package oneline folds text (an error, a tool's output) into the one line
// that every nexus error message is.
package oneline

import (
	"strings"
	"unicode/utf8"
)

// Max bounds a folded line: a tool that prints a screenful (e2fsck, mkfs)
// must not make an error message unbounded.
const Max = 2000

// Of collapses every run of whitespace in s, newlines included, to one
// space, trims the ends, and cuts the result at Max bytes (on a rune
// boundary, marked "…").
func Of(s string) string {
	line := strings.Join(strings.Fields(s), " ")
	if len(line) <= Max {
		return line
	}
	cut := Max
	for cut > 0 && !utf8.RuneStart(line[cut]) {
		cut--
	}
	return line[:cut] + "…"
}
