package events

// SagaKind names a flow run as a saga. It is a string on the wire
// (saga.started's "kind"), so a kind is never renamed: a journal written
// with it must keep meaning the same flow.
type SagaKind string

const (
	SagaCreate   SagaKind = "create"
	SagaFork     SagaKind = "fork"
	SagaRestore  SagaKind = "restore"
	SagaSnapshot SagaKind = "snapshot"
	SagaStart    SagaKind = "start"
	SagaStop     SagaKind = "stop"
	SagaRm       SagaKind = "rm"
	SagaRecover  SagaKind = "recover"
	SagaReap     SagaKind = "reap"
	SagaVolumeRm SagaKind = "volume-rm"
	// SagaSnapshotRm deletes one snapshot of a sandbox; finished forward.
	SagaSnapshotRm SagaKind = "snapshot-rm"
)

// CreatesSandbox reports whether a saga of kind k brings a new sandbox into
// being (and so is compensated, not resumed, if its runner dies before the
// commit).
func (k SagaKind) CreatesSandbox() bool {
	return k == SagaCreate || k == SagaFork || k == SagaRestore
}

// Teardown reports whether a saga of kind k only takes a sandbox down: it
// is finished forward, never compensated.
func (k SagaKind) Teardown() bool { return k == SagaRm || k == SagaStop }
