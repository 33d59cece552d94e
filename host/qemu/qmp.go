package qemu

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// monitor is a QMP client: JSON lines over QEMU's monitor socket, one
// command at a time, events handed to a callback. It is written here
// rather than taken from github.com/digitalocean/go-qemu/qmp, whose
// package links a libvirt RPC client into nexus and whose commands take
// no deadline (a wedged QEMU would hang the API call that asked).
type monitor struct {
	c       net.Conn
	onEvent func(name string, data json.RawMessage)

	cmd     sync.Mutex // one command in flight
	replies chan qmpReply
	closed  chan struct{}
}

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
	err   error
}

// dialMonitor connects, reads QEMU's greeting and leaves capability
// negotiation (the only state in which QEMU refuses commands).
func dialMonitor(path string, onEvent func(string, json.RawMessage)) (*monitor, error) {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil, err
	}
	m := &monitor{c: c, onEvent: onEvent, replies: make(chan qmpReply, 1), closed: make(chan struct{})}
	r := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	line, err := r.ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &greeting)
	}
	if err == nil && greeting.QMP == nil {
		err = fmt.Errorf("not a QMP greeting: %.80s", line)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	c.SetReadDeadline(time.Time{})
	go m.read(r)
	if err := m.run("qmp_capabilities", nil, nil, 10*time.Second); err != nil {
		c.Close()
		return nil, err
	}
	return m, nil
}

func (m *monitor) read(r *bufio.Reader) {
	defer close(m.closed)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var msg qmpReply
		if json.Unmarshal(line, &msg) != nil {
			continue
		}
		if msg.Event != "" {
			if m.onEvent != nil {
				m.onEvent(msg.Event, msg.Data)
			}
			continue
		}
		select {
		case m.replies <- msg:
		default: // an answer to a command whose caller gave up
		}
	}
}

// errMonitorClosed: QEMU closed the monitor (it exited, or is exiting).
var errMonitorClosed = errors.New("QMP connection closed")

// run sends one command and waits up to timeout for its answer, decoding
// the return value into out when given.
func (m *monitor) run(name string, args, out any, timeout time.Duration) error {
	m.cmd.Lock()
	defer m.cmd.Unlock()
	// Drop a late answer to an earlier command that timed out.
	select {
	case <-m.replies:
	default:
	}
	req := map[string]any{"execute": name}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	m.c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := m.c.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("QMP %s: %w", name, err)
	}
	select {
	case r := <-m.replies:
		if r.Error != nil {
			return fmt.Errorf("QMP %s: %s: %s", name, r.Error.Class, r.Error.Desc)
		}
		if out != nil {
			return json.Unmarshal(r.Return, out)
		}
		return nil
	case <-m.closed:
		return fmt.Errorf("QMP %s: %w", name, errMonitorClosed)
	case <-time.After(timeout):
		return fmt.Errorf("QMP %s: no answer within %s", name, timeout)
	}
}

func (m *monitor) close() { m.c.Close() }
