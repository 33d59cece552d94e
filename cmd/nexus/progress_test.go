package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// A copy that outlasts the delay gets a bar naming it; one that ends
// sooner prints nothing.
func TestProgressBarOnlyForLongCopies(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	quick := terminalProgress{w: &out, delay: time.Hour}
	update, end := quick.Copy("os disk of quick")
	update(1<<20, 64<<20)
	update(64<<20, 64<<20)
	end()
	if out.Len() != 0 {
		t.Fatalf("a copy shorter than the delay printed %q", out.String())
	}

	slow := terminalProgress{w: &out, delay: 0}
	update, end = slow.Copy("os disk of slow")
	update(16<<20, 64<<20)
	update(64<<20, 64<<20)
	end()
	if !strings.Contains(out.String(), "os disk of slow") {
		t.Fatalf("a long copy's bar does not name it: %q", out.String())
	}
}
