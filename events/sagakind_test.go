package events

import "testing"

func TestSagaKindClasses(t *testing.T) {
	all := []SagaKind{SagaCreate, SagaFork, SagaRestore, SagaSnapshot, SagaStart, SagaStop, SagaRm, SagaRecover, SagaReap, SagaVolumeRm}
	creates := map[SagaKind]bool{SagaCreate: true, SagaFork: true, SagaRestore: true}
	teardowns := map[SagaKind]bool{SagaRm: true, SagaStop: true}
	for _, k := range all {
		if k.CreatesSandbox() != creates[k] {
			t.Errorf("%s.CreatesSandbox() = %v", k, k.CreatesSandbox())
		}
		if k.Teardown() != teardowns[k] {
			t.Errorf("%s.Teardown() = %v", k, k.Teardown())
		}
	}
	// The kinds are on the wire: a rename would make old journals mean
	// another flow.
	if SagaVolumeRm != "volume-rm" || SagaCreate != "create" || SagaRm != "rm" {
		t.Error("a saga kind's wire name changed")
	}
}
