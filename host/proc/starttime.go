package proc

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
)

// userHZ is the unit of /proc/<pid>/stat's starttime. Linux fixes the
// userspace tick at 100 on every architecture nexus runs on
// (sysconf(_SC_CLK_TCK)).
const userHZ = 100

var (
	btimeOnce sync.Once
	btimeSec  int64
	btimeErr  error
)

// bootTime is /proc/stat's btime: the boot instant, in Unix seconds.
func bootTime() (int64, error) {
	btimeOnce.Do(func() {
		data, err := os.ReadFile("/proc/stat")
		if err != nil {
			btimeErr = err
			return
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "btime "); ok {
				btimeSec, btimeErr = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return
			}
		}
		btimeErr = errors.New("/proc/stat has no btime")
	})
	return btimeSec, btimeErr
}

// StartUnixMs is when id's process started, in Unix milliseconds: the
// form a record other languages read names a process by (with its pid).
func (id Identity) StartUnixMs() (int64, error) {
	bt, err := bootTime()
	if err != nil {
		return 0, err
	}
	return bt*1000 + int64(id.StartTicks)*1000/userHZ, nil
}
