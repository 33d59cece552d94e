package main

import (
	"context"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/reaper"
	"github.com/nexus-sandbox/nexus/session"
)

// completionTimeout bounds how long a shell waits for a completion: past
// it, the shell offers nothing rather than hanging on a busy journal.
const completionTimeout = 3 * time.Second

// argCompleters complete the positional arguments of commands, by command
// path below the root.
var argCompleters = map[string]func(*globals) cobra.CompletionFunc{
	"inspect":         sandboxRefs,
	"rm":              sandboxRefs,
	"stop":            sandboxRefs,
	"start":           sandboxRefs,
	"fork":            sandboxRefs,
	"snapshot":        sandboxRefs,
	"replay timeline": sandboxRefs,
	"restore":         snapshotIDs,
	"rename":          firstArg(sandboxRefs),
	"snapshot rm":     snapshotIDs,
	"snapshot ls":     sandboxRefs,
	"volume rm":       volumeNames,
	"logs":            sandboxRefs,
	"exec":            firstArg(sandboxRefs),
}

// firstArg completes only a command's first argument with f: what
// follows (exec's command, cp's other path) is the shell's to complete.
func firstArg(f func(*globals) cobra.CompletionFunc) func(*globals) cobra.CompletionFunc {
	return func(g *globals) cobra.CompletionFunc {
		complete := f(g)
		return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveDefault
			}
			return complete(cmd, args, toComplete)
		}
	}
}

// flagCompleters complete flag values wherever a command has the flag.
var flagCompleters = map[string]func(*globals) cobra.CompletionFunc{
	"driver":  fixedValues(config.Drivers...),
	"type":    eventTypes,
	"kind":    reapKindValues,
	"sandbox": sandboxRefs,
	"log":     fixedValues(session.LogKinds()...),
	"filter":  filterKeys,
}

func addCompletions(root *cobra.Command, g *globals) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if f, ok := argCompleters[commandKey(c)]; ok {
			c.ValidArgsFunction = f(g)
		}
		// The flags declared on c itself: LocalFlags would merge every
		// parent's flag set into each command, on every command line.
		for name, f := range flagCompleters {
			if c.Flags().Lookup(name) != nil || c.PersistentFlags().Lookup(name) != nil {
				_ = c.RegisterFlagCompletionFunc(name, f(g))
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// fromState completes from the state root's projections, without creating
// a root that does not exist yet.
func fromState(g *globals, list func(ctx context.Context, b control.Backend, typed string) ([]cobra.Completion, error)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, typed string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if _, err := os.Stat(g.stateDir); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
		defer cancel()
		var out []cobra.Completion
		err := withBackend(ctx, g, func(b control.Backend) error {
			var err error
			out, err = list(ctx, b, typed)
			return err
		})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// sandboxRefs offers the IDs and handles of the sandboxes that start
// with what is typed, described by state. An ID typed in full is one
// per-entity read (no other ID starts with it); anything else, a handle
// included (web may be completed to web2), reads the view a page at a
// time, as ls does, never as one answer holding every sandbox.
func sandboxRefs(g *globals) cobra.CompletionFunc {
	return fromState(g, func(ctx context.Context, b control.Backend, typed string) ([]cobra.Completion, error) {
		var out []cobra.Completion
		err := eachSandbox(ctx, b, typed, func(sb projections.Sandbox) {
			desc := string(sb.State)
			if sb.Handle != "" && strings.HasPrefix(sb.Handle, typed) {
				out = append(out, cobra.CompletionWithDesc(sb.Handle, desc+" "+sb.ID))
			}
			if sb.Handle != "" {
				desc += " " + sb.Handle
			}
			if strings.HasPrefix(sb.ID, strings.ToUpper(typed)) {
				out = append(out, cobra.CompletionWithDesc(sb.ID, desc))
			}
		})
		return out, err
	})
}

// snapshotIDs offers the snapshots that start with what is typed,
// described by their sandbox: a snapshot ID typed in full is one
// per-entity read, a prefix that could be an ID's (projections.MinPrefix
// characters or more) a seek in the store's snapshot index, which offers
// at most the first few it names, and anything shorter reads the view a
// page at a time.
func snapshotIDs(g *globals) cobra.CompletionFunc {
	return fromState(g, func(ctx context.Context, b control.Backend, typed string) ([]cobra.Completion, error) {
		typed = strings.ToUpper(typed)
		var out []cobra.Completion
		offer := func(sb projections.Sandbox) {
			for _, snap := range sb.Snapshots {
				if strings.HasPrefix(snap, typed) {
					out = append(out, cobra.CompletionWithDesc(snap, "of "+sandboxName(sb)))
				}
			}
		}
		if _, err := ulid.ParseStrict(typed); err == nil {
			sb, found, err := b.SnapshotOwner(ctx, typed)
			if found {
				offer(sb)
			}
			return out, err
		}
		if projections.IDPrefixLike(typed) {
			return snapshotsNamed(ctx, b, typed)
		}
		err := eachSandbox(ctx, b, "", offer)
		return out, err
	})
}

// snapshotsNamed offers the snapshots whose ID begins with prefix among
// those the backend names for it, each described by its sandbox (one
// read per sandbox).
func snapshotsNamed(ctx context.Context, b control.Backend, prefix string) ([]cobra.Completion, error) {
	refs, err := b.SnapshotsNamed(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var out []cobra.Completion
	seen, names := map[string]bool{}, map[string]string{}
	for _, r := range refs {
		if seen[r.ID] || !strings.HasPrefix(r.ID, prefix) {
			continue
		}
		seen[r.ID] = true
		name, ok := names[r.Sandbox]
		if !ok {
			sb, found, err := b.Sandbox(ctx, r.Sandbox)
			if err != nil {
				return nil, err
			}
			name = r.Sandbox
			if found {
				name = sandboxName(sb)
			}
			names[r.Sandbox] = name
		}
		out = append(out, cobra.CompletionWithDesc(r.ID, "of "+name))
	}
	return out, nil
}

// eachSandbox calls fn with the sandbox whose full ID typed is (one
// per-entity read; nothing if there is none), else with every sandbox, a
// page at a time.
func eachSandbox(ctx context.Context, b control.Backend, typed string, fn func(projections.Sandbox)) error {
	if id, err := ulid.ParseStrict(typed); err == nil {
		sb, found, err := b.Sandbox(ctx, id.String())
		if found {
			fn(sb)
		}
		return err
	}
	for after := ""; ; {
		page, err := b.SandboxPage(ctx, after, lsPage)
		if err != nil || len(page) == 0 {
			return err
		}
		for _, sb := range page {
			fn(sb)
		}
		after = page[len(page)-1].ID
	}
}

func volumeNames(g *globals) cobra.CompletionFunc {
	return fromState(g, func(ctx context.Context, b control.Backend, _ string) ([]cobra.Completion, error) {
		list, err := b.Volumes(ctx)
		if err != nil {
			return nil, err
		}
		var out []cobra.Completion
		for _, v := range list {
			desc := "detached"
			if len(v.AttachedTo) > 0 {
				desc = "attached to " + strings.Join(v.AttachedTo, ", ")
			}
			out = append(out, cobra.CompletionWithDesc(v.Name, desc))
		}
		return out, nil
	})
}

func sandboxName(sb projections.Sandbox) string {
	if sb.Handle != "" {
		return sb.Handle
	}
	return sb.ID
}

func fixedValues(values ...string) func(*globals) cobra.CompletionFunc {
	return func(*globals) cobra.CompletionFunc {
		return cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)
	}
}

// eventTypes offers every event type and every category (the prefix before
// the first dot), which --type also accepts.
func eventTypes(*globals) cobra.CompletionFunc {
	var values []string
	for _, t := range events.Types() {
		values = append(values, string(t))
		if cat, _, ok := strings.Cut(string(t), "."); ok && !slices.Contains(values, cat) {
			values = append(values, cat)
		}
	}
	slices.Sort(values)
	return cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)
}

func reapKindValues(*globals) cobra.CompletionFunc {
	values := make([]string, len(reaper.Kinds))
	for i, k := range reaper.Kinds {
		values[i] = string(k)
	}
	return cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)
}

// filterKeys offers the --filter keys the command takes, each up to its
// '=' (the value is the user's), and the values of state= and ready=.
func filterKeys(*globals) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		valid := projections.SandboxFilters
		switch commandKey(cmd) {
		case "volume ls":
			valid = projections.VolumeFilters
		case "snapshot ls":
			valid = projections.SnapshotFilters
		}
		var out []cobra.Completion
		for _, k := range valid {
			switch k {
			case projections.FilterState:
				for _, s := range []projections.State{projections.StateRunning, projections.StateStopped, projections.StateExited, projections.StateError, projections.StateCreating} {
					out = append(out, "state="+string(s))
				}
			case projections.FilterReady:
				out = append(out, "ready=true", "ready=false")
			default:
				out = append(out, string(k)+"=")
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	}
}
