package projections

import (
	"sort"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/events"
)

// Volume is a named, user-owned volume and who it is attached to.
type Volume struct {
	Name       string   `msgpack:"name" json:"name"`
	Path       string   `msgpack:"path" json:"path"`
	SizeBytes  int64    `msgpack:"size" json:"size_bytes"`
	AttachedTo []string `msgpack:"att,omitempty" json:"attached_to"`
	// Rev is the sequence of the last event naming this volume: the
	// entity sequence a decision about it expects (core.Expect).
	Rev uint64 `msgpack:"rev" json:"rev"`
	// Labels are the operator's, given when the volume was created.
	Labels events.Labels `msgpack:"labels,omitempty" json:"labels,omitempty"`
}

// Volumes is every named volume. Attachments end when the sandbox detaches
// the volume or is removed, so a removed sandbox can never leave a stale
// attachment behind that would block `volume rm`.
type Volumes struct {
	seq    uint64
	byName map[string]*Volume
}

func NewVolumes() *Volumes { return &Volumes{byName: map[string]*Volume{}} }

func (*Volumes) Name() string  { return "volumes" }
func (v *Volumes) Seq() uint64 { return v.seq }

func (v *Volumes) Get(name string) *Volume { return v.byName[name] }

func (v *Volumes) List() []*Volume {
	out := make([]*Volume, 0, len(v.byName))
	for _, vol := range v.byName {
		out = append(out, vol)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (v *Volumes) Apply(seq uint64, e events.Event) {
	v.seq = seq
	switch p := e.Payload.(type) {
	case events.VolumeCreatedEvent:
		v.byName[p.Name] = &Volume{Name: p.Name, Path: p.Path, SizeBytes: p.SizeBytes, Rev: seq, Labels: p.Labels}
	case events.VolumeRemovedEvent:
		delete(v.byName, p.Name)
	case events.VolumeAttachedEvent:
		if vol := v.byName[p.Name]; vol != nil {
			vol.Rev = seq
			if !contains(vol.AttachedTo, e.Sandbox) {
				vol.AttachedTo = append(vol.AttachedTo, e.Sandbox)
			}
		}
	case events.VolumeDetachedEvent:
		if vol := v.byName[p.Name]; vol != nil {
			vol.Rev = seq
			vol.AttachedTo = without(vol.AttachedTo, e.Sandbox)
		}
	case events.SandboxRemovedEvent:
		for _, vol := range v.byName {
			vol.AttachedTo = without(vol.AttachedTo, e.Sandbox)
		}
	}
}

func without(list []string, s string) []string {
	var out []string
	for _, x := range list {
		if x != s {
			out = append(out, x)
		}
	}
	return out
}

func (v *Volumes) MarshalState() ([]byte, error) { return msgpack.Marshal(v.List()) }

func (v *Volumes) UnmarshalState(seq uint64, data []byte) error {
	var list []*Volume
	if err := events.StrictUnmarshal(data, &list); err != nil {
		return err
	}
	m := make(map[string]*Volume, len(list))
	for _, vol := range list {
		m[vol.Name] = vol
	}
	v.seq, v.byName = seq, m
	return nil
}
