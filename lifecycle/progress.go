package lifecycle

import "github.com/nexus-sandbox/nexus/host/disk"

// Progress shows a person how far a long copy is. The CLI sets one only
// when stderr is a terminal; nil shows nothing.
type Progress interface {
	// Copy begins showing the copy described by what (e.g. "os-disk of
	// 01J…"); update hears its position (done of total bytes, as
	// disk.Progress), end closes the display whether the copy finished or
	// failed.
	Copy(what string) (update func(done, total int64), end func())
}

// clone is disk.Clone shown through m.Progress.
func (m *Manager) clone(what, src, dst string) (disk.Method, error) {
	if m.Progress == nil {
		return disk.Clone(src, dst)
	}
	update, end := m.Progress.Copy(what)
	defer end()
	return disk.CloneProgress(src, dst, update)
}

// copyProgress is the position callback of one copy, and its end.
func (m *Manager) copyProgress(what string) (disk.Progress, func()) {
	if m.Progress == nil {
		return nil, func() {}
	}
	update, end := m.Progress.Copy(what)
	return update, end
}
