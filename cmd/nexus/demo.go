package main

import (
	"context"
	"fmt"

	"github.com/oklog/ulid/v2"
	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/sagas"
)

// demoCmd journals the events of one simulated sandbox lifecycle through
// the real saga runner and journal. It creates no VM and no disk: it shows
// the event flow until the lifecycle flows land.
func demoCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Journal a simulated sandbox lifecycle (no VM, no disks) to show the event flow",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withBackend(cmd.Context(), g, func(b control.Backend) error {
				id, err := runDemo(cmd.Context(), b)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "journaled a simulated lifecycle for sandbox %s\n", id)
				return nil
			})
		},
	}
}

func runDemo(ctx context.Context, j sagas.Journal) (string, error) {
	id := ulid.Make().String()
	res := func(kind events.ResourceKind, path string) events.Resource {
		return events.Resource{Kind: kind, Path: path}
	}
	intent := res(events.KindCreateIntent, "disks/"+id+".create-intent.json")
	raw := res(events.KindRawDisk, "disks/"+id+".raw")
	emit := func(p events.Payload) func(context.Context) ([]events.Payload, error) {
		return func(context.Context) ([]events.Payload, error) { return sagas.One(p), nil }
	}
	create := &sagas.Saga{Kind: "create", Sandbox: id, Steps: []sagas.Step{
		{Name: "intent", Do: emit(events.IntentWrittenEvent{Resource: intent, Covers: []string{raw.Path}})},
		{Name: "os-disk", Do: emit(events.DiskMaterialisedEvent{Resource: raw, Method: "simulated"})},
		{Name: "commit", Do: emit(events.SandboxCreatedEvent{Handle: "demo-" + id[20:], Image: "demo.raw", Driver: "process", Resources: []events.Resource{raw}})},
		{Name: "retire-intent", Do: emit(events.IntentRetiredEvent{Resource: intent})},
	}}
	if err := create.Run(ctx, j); err != nil {
		return "", err
	}
	remove := &sagas.Saga{Kind: "rm", Sandbox: id, Steps: []sagas.Step{
		{Name: "reclaim-os-disk", Do: emit(events.ResourceReclaimedEvent{Resource: raw, By: "rm"})},
		{Name: "remove", Do: emit(events.SandboxRemovedEvent{})},
	}}
	return id, remove.Run(ctx, j)
}
