package sagas

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
)

type spanKey struct{}

// recordingTracer keeps each span as "parent>name:outcome", its parent
// read from the context the span was started under.
type recordingTracer struct{ spans []string }

func (r *recordingTracer) Start(ctx context.Context, s Span) (context.Context, func(error)) {
	name := "saga." + string(s.Kind)
	if s.Step != "" {
		name = s.Step
	}
	parent, _ := ctx.Value(spanKey{}).(string)
	return context.WithValue(ctx, spanKey{}, name), func(err error) {
		outcome := "ok"
		if err != nil {
			outcome = "error"
		}
		r.spans = append(r.spans, parent+">"+name+":"+outcome)
	}
}

// A saga is one span and each step, and each undo of a compensation, a
// span under it that ends with the step's outcome.
func TestTracerHearsTheSagaAndEachStep(t *testing.T) {
	tr := &recordingTracer{}
	SetTracer(tr)
	t.Cleanup(func() { SetTracer(nil) })
	var undone []string
	boom := Step{Name: "c", Do: func(context.Context) ([]events.Payload, error) { return nil, errors.New("boom") }}
	s := &Saga{Kind: "create", Sandbox: sb1, Steps: []Step{recordingStep("a", &undone), recordingStep("b", &undone), boom}}
	if err := s.Run(context.Background(), newGuarded()); !errors.Is(err, ErrCompensated) {
		t.Fatalf("Run = %v, want compensated", err)
	}
	want := []string{
		"saga.create>a:ok", "saga.create>b:ok", "saga.create>c:error",
		"saga.create>undo.b:ok", "saga.create>undo.a:ok", ">saga.create:error",
	}
	if !reflect.DeepEqual(tr.spans, want) {
		t.Fatalf("spans %v, want %v", tr.spans, want)
	}
}
