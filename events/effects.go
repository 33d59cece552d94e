package events

// Effects is what e says about resource ownership: the resources its
// sandbox claims and the ones it gives back. It is the one statement of
// which event claims or releases what; the fold that tracks ownership
// (projections.Sandboxes, whose indexes the store persists) applies it,
// so no other statement of it can drift. A claim or release names resources of e.Sandbox;
// whether the sandbox is known, and what an already-owned path means, is
// the fold's business.
//
// sandbox.removed releases everything its sandbox still owns, which the
// event does not list: a fold drops the sandbox's resources itself.
func Effects(e Event) (claimed, released []Resource) {
	switch p := e.Payload.(type) {
	case SandboxCreatedEvent:
		return p.Resources, nil
	case SandboxForkedEvent:
		return p.Resources, nil
	case SandboxRestoredEvent:
		return p.Resources, nil
	case SandboxStartedEvent:
		return p.Sockets, nil
	case DiskMaterialisedEvent:
		return []Resource{p.Resource}, nil
	case IntentWrittenEvent:
		return []Resource{p.Resource}, nil
	case ResourceCreatedEvent:
		return []Resource{p.Resource}, nil
	case SupervisorStartedEvent:
		return []Resource{p.StateDir}, nil
	case SnapshotTakenEvent:
		return []Resource{p.Dir}, nil
	case IntentRetiredEvent:
		return nil, []Resource{p.Resource}
	case ResourceReclaimedEvent:
		return nil, []Resource{p.Resource}
	}
	return nil, nil
}
