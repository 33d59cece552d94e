package main

import (
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/nexus-sandbox/nexus/session"
)

// progressDelay is how long a copy runs before it gets a bar: most copies
// (reflinks, small images) end sooner and print nothing.
const progressDelay = time.Second

// terminalProgress draws a bar on stderr for each copy that outlasts
// progressDelay.
type terminalProgress struct {
	w     io.Writer
	delay time.Duration
}

// progressFor returns the progress display for this process: a bar on
// stderr when it is a terminal, nothing otherwise (pipes, logs, CI).
func progressFor() session.Progress {
	if !term.IsTerminal(int(os.Stderr.Fd())) {
		return nil
	}
	return terminalProgress{w: os.Stderr, delay: progressDelay}
}

func (p terminalProgress) Copy(what string) (func(done, total int64), func()) {
	start := time.Now()
	var mu sync.Mutex
	var bar *progressbar.ProgressBar
	update := func(done, total int64) {
		mu.Lock()
		defer mu.Unlock()
		if bar == nil {
			if time.Since(start) < p.delay || done >= total {
				return
			}
			bar = progressbar.NewOptions64(total,
				progressbar.OptionSetWriter(p.w),
				progressbar.OptionSetDescription(what),
				progressbar.OptionShowBytes(true),
				progressbar.OptionSetWidth(30),
				progressbar.OptionThrottle(100*time.Millisecond),
				progressbar.OptionClearOnFinish(),
			)
		}
		_ = bar.Set64(done)
	}
	end := func() {
		mu.Lock()
		defer mu.Unlock()
		if bar != nil {
			_ = bar.Finish()
		}
	}
	return update, end
}
