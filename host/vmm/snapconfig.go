package vmm

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// SnapshotEdit is what a restore into another sandbox must change in the
// config.json CH wrote: the paths that name the source sandbox's own
// files. Everything else (device ids, image types, queue settings,
// serial and console, rng, platform, cpus, memory, payload, and any field
// this code does not know) is carried over byte for byte, because CH
// restores device state by device id and guest memory against that exact
// configuration.
type SnapshotEdit struct {
	// Disks maps each disk path the snapshot names to the path the
	// restored VM opens instead. A disk the map does not name is an error:
	// a restored VM never opens its source's disks.
	Disks map[string]string
	// VsockSocket replaces the vsock's host socket, when set.
	VsockSocket string
	// SerialFile replaces the serial port's file (mode File), when set: CH
	// truncates that file when it opens it, so it must be the restored
	// sandbox's own.
	SerialFile string
}

// SnapshotDisks lists the disks a snapshot's config.json names, in order.
func SnapshotDisks(configJSON []byte) ([]Disk, error) {
	var cfg struct {
		Disks []Disk `json:"disks"`
	}
	if err := json.Unmarshal(configJSON, &cfg); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", SnapshotConfigFile, err)
	}
	return cfg.Disks, nil
}

// EditSnapshotConfig applies e to a config.json CH wrote, as generic JSON.
func EditSnapshotConfig(configJSON []byte, e SnapshotEdit) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(configJSON, &top); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", SnapshotConfigFile, err)
	}
	if top == nil {
		return nil, fmt.Errorf("snapshot %s: not a JSON object", SnapshotConfigFile)
	}
	if raw, ok := top["disks"]; ok && !isNull(raw) {
		var disks []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &disks); err != nil {
			return nil, fmt.Errorf("snapshot %s: disks: %w", SnapshotConfigFile, err)
		}
		for i, d := range disks {
			var path string
			if err := json.Unmarshal(d["path"], &path); err != nil {
				return nil, fmt.Errorf("snapshot %s: disk %d: path: %w", SnapshotConfigFile, i, err)
			}
			to, ok := e.Disks[path]
			if !ok {
				return nil, fmt.Errorf("snapshot %s: disk %d (%s) has no replacement", SnapshotConfigFile, i, path)
			}
			d["path"] = mustJSON(to)
		}
		top["disks"] = mustJSON(disks)
	}
	if e.VsockSocket != "" {
		if err := setField(top, "vsock", "socket", e.VsockSocket, false); err != nil {
			return nil, err
		}
	}
	if e.SerialFile != "" {
		if err := setField(top, "serial", "file", e.SerialFile, true); err != nil {
			return nil, err
		}
	}
	return json.Marshal(top)
}

// setField sets top[obj][field] = value; with onlyFileMode, only when the
// object's mode is File (another mode has no file to replace).
func setField(top map[string]json.RawMessage, obj, field, value string, onlyFileMode bool) error {
	raw, ok := top[obj]
	if !ok || isNull(raw) {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("snapshot %s: %s: %w", SnapshotConfigFile, obj, err)
	}
	if onlyFileMode {
		var mode ConsoleMode
		json.Unmarshal(m["mode"], &mode)
		if mode != ConsoleFile {
			return nil
		}
	}
	m[field] = mustJSON(value)
	top[obj] = mustJSON(m)
	return nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

func mustJSON(v any) json.RawMessage {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // strings and maps of raw messages always marshal
	}
	return data
}
