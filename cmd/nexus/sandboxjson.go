package main

import (
	"time"

	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/replay"
)

// The sandbox's JSON form is projections' (SandboxDocument), which the
// store also keeps for listings.
type (
	jsonSandbox    = projections.SandboxJSON
	jsonBoot       = projections.BootJSON
	jsonProcess    = projections.ProcessJSON
	jsonAttachment = projections.AttachmentJSON
	jsonCondition  = projections.ConditionJSON
)

func sandboxJSON(sb projections.Sandbox) jsonSandbox { return projections.SandboxDocument(sb) }

// sandboxesJSON is sandboxJSON of each.
func sandboxesJSON(list []projections.Sandbox) []jsonSandbox {
	out := make([]jsonSandbox, len(list))
	for i, sb := range list {
		out[i] = sandboxJSON(sb)
	}
	return out
}

// jsonReplayState is replay.State as `replay at` prints it (docs/json.md's
// ReplayState), its sandboxes as every other command shows them.
type jsonReplayState struct {
	Seq       uint64                  `json:"seq"`
	Time      time.Time               `json:"time"`
	Sandboxes []jsonSandbox           `json:"sandboxes"`
	Ownership []projections.OwnedPath `json:"ownership"`
	Volumes   []*projections.Volume   `json:"volumes"`
	OpenSagas []*projections.OpenSaga `json:"open_sagas"`
}

func replayStateJSON(st replay.State) jsonReplayState {
	out := jsonReplayState{Seq: st.Seq, Time: st.Time, Ownership: st.Ownership, Volumes: st.Volumes, OpenSagas: st.OpenSagas}
	for _, sb := range st.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, sandboxJSON(*sb))
	}
	return out
}
