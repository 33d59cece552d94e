package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
	"github.com/nexus-sandbox/nexus/oneline"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/session"
)

// lockWait is how long a command waits for another command that holds the
// state root without a daemon.
const lockWait = 10 * time.Second

// defaultIdle is how long a daemon started on demand outlives its last
// client (env NEXUS_DAEMON_IDLE).
const defaultIdle = 30 * time.Second

func withBackend(ctx context.Context, g *globals, fn func(control.Backend) error) error {
	return withBackendOwned(ctx, g, false, fn)
}

// withBackendOwned with owned set asks for the journal in this process (an
// on-demand daemon retires for it); see control.ConnectOptions.Exclusive.
func withBackendOwned(ctx context.Context, g *globals, owned bool, fn func(control.Backend) error) error {
	o, err := connectOptions(g)
	if err != nil {
		return err
	}
	o.Exclusive = owned
	b, err := control.ConnectWith(ctx, g.stateDir, o)
	if err != nil {
		return inNexusd(err)
	}
	return errors.Join(fn(b), b.Close())
}

// connectOptions: with no daemon answering, start one on demand, unless
// NEXUS_NO_AUTO_DAEMON=1 asks for the journal in this process.
func connectOptions(g *globals) (control.ConnectOptions, error) {
	o := control.ConnectOptions{Wait: lockWait, InProcess: inProcess()}
	if os.Getenv("NEXUS_NO_AUTO_DAEMON") == "1" {
		return o, nil
	}
	exe, err := daemonBinary()
	if err != nil {
		return o, err
	}
	wait, err := spawnWaitFromEnv()
	if err != nil {
		return o, err
	}
	o.Auto = &control.AutoStart{Exe: exe, Args: func(root string) []string {
		return []string{"--state-dir", root, "daemon", "--auto"}
	}, LockWait: wait, Locked: spawnLockHook(), Ensured: ensuredHook(), Notice: func(line string) {
		fmt.Fprintf(os.Stderr, "nexus: %s\n", oneline.Of(line))
	}}
	o.Auto.Fleet, o.Auto.CompareFleet = configuredFleet(g)
	return o, nil
}

// spawnWaitFromEnv reads NEXUS_SPAWN_WAIT, the bound on waiting for a
// stopped command that holds the daemon spawn lock (0: the default).
func spawnWaitFromEnv() (time.Duration, error) {
	s := os.Getenv("NEXUS_SPAWN_WAIT")
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, usageError{fmt.Errorf("NEXUS_SPAWN_WAIT=%q: want a positive duration such as 30s", s)}
	}
	return d, nil
}

// idleFromEnv reads NEXUS_DAEMON_IDLE for a daemon started on demand.
func idleFromEnv() (time.Duration, error) {
	s := os.Getenv("NEXUS_DAEMON_IDLE")
	if s == "" {
		return defaultIdle, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("NEXUS_DAEMON_IDLE=%q: want a positive duration such as 30s", s)
	}
	return d, nil
}

func daemonCmd(g *globals) *cobra.Command {
	var f daemonFlags
	c := &cobra.Command{
		Use:   "daemon",
		Short: "Keep the journal open and serve commands (and, with --listen, subscribers)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDaemon(cmd, g, &f)
		},
	}
	c.Flags().StringVar(&f.listen, "listen", "", "expose NATS to read-only subscribers on HOST:PORT (loopback unless --allow-remote; port 0 picks one)")
	c.Flags().StringVar(&f.metricsListen, "metrics-listen", "", "also serve the Prometheus metrics (always at /metrics on nexus.sock) on HOST:PORT")
	c.Flags().BoolVar(&f.allowRemote, "allow-remote", false, "allow a --listen address beyond loopback (needs --tls-cert and --tls-key)")
	c.Flags().StringVar(&f.tlsCert, "tls-cert", "", "PEM certificate of the --listen port (TLS only, with --tls-key)")
	c.Flags().StringVar(&f.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	c.Flags().StringVar(&f.tlsClientCA, "tls-client-ca", "", "PEM CA bundle subscribers' client certificates must chain to (mutual TLS)")
	c.Flags().DurationVar(&f.idle, "idle", 0, "exit once no command has been connected for this long (0: never; on-demand daemons default to $NEXUS_DAEMON_IDLE or 30s)")
	c.Flags().BoolVar(&f.auto, "auto", false, "started on demand by a command (idles out; retires for a removing ledger sweep or a hand-started daemon)")
	c.Flags().MarkHidden("auto")
	c.Flags().StringArrayVar(&f.mirrorURLs, "mirror", nil, "mirror the journal to a fleet's JetStream through its leaf-node URL (nats-leaf://[user:pass@]HOST:PORT); repeat it or separate with commas for several nodes (default $NEXUS_MIRROR, which keeps a password off the command line)")
	c.Flags().StringVar(&f.mirror.Domain, "mirror-domain", defaultMirrorDomain, "the fleet's JetStream domain, where the mirror stream NEXUS_<HOST> is made")
	c.Flags().StringVar(&f.mirror.Host, "mirror-host", "", "this host's name in the fleet, [a-z0-9-]: subject prefix and stream suffix (default: the hostname, lower-cased)")
	c.Flags().StringVar(&f.mirror.Credentials, "mirror-creds", "", "NATS .creds file for the fleet link")
	c.Flags().IntVar(&f.mirror.Replicas, "mirror-replicas", 0, "replicas of the mirror when nexus creates it (default 3, or 1 on a fleet that cannot place 3)")
	c.Flags().StringVar(&f.mirrorBytes, "mirror-max-bytes", defaultMirrorMaxBytes, "byte limit of the mirror when nexus creates it (0: none)")
	c.AddCommand(daemonStatusCmd(g), daemonStopCmd(g), daemonMetricsCmd(g))
	return c
}

// daemonFlags are nexus daemon's flags, as given.
type daemonFlags struct {
	listen, metricsListen        string
	tlsCert, tlsKey, tlsClientCA string
	allowRemote, auto            bool
	idle                         time.Duration
	mirrorURLs                   []string
	mirror                       fleetstate.Settings
	mirrorBytes                  string
}

// The defaults of the daemon's --mirror-domain and --mirror-max-bytes.
const (
	defaultMirrorDomain   = "fleet"
	defaultMirrorMaxBytes = "0"
)

// daemonMirror is the one place a daemon's fleet settings are decided, for
// the daemon and for a command about to use an on-demand one: the
// --mirror flags (urls, and m and maxBytes where changed says a flag was
// given), else NEXUS_MIRROR, else the config file's [fleet] section. Nil:
// the daemon mirrors nothing.
func daemonMirror(g *globals, urls []string, m *fleetstate.Settings, maxBytes string, changed func(flag string) bool) (*fleetstate.Settings, error) {
	if len(urls) == 0 && os.Getenv("NEXUS_MIRROR") != "" {
		urls = []string{os.Getenv("NEXUS_MIRROR")}
	}
	if len(urls) == 0 {
		var err error
		if urls, err = fleetFromConfig(changed, g, m, &maxBytes); err != nil {
			return nil, err
		}
	}
	if len(urls) == 0 {
		return nil, nil
	}
	if err := mirrorFlags(m, urls, maxBytes); err != nil {
		return nil, usageError{err}
	}
	return m, nil
}

// configuredFleet is the fingerprint of the fleet settings an on-demand
// daemon started now would mirror with, and whether they could be read.
func configuredFleet(g *globals) (string, bool) {
	m, err := daemonMirror(g, nil, &fleetstate.Settings{Domain: defaultMirrorDomain}, defaultMirrorMaxBytes, func(string) bool { return false })
	if err != nil {
		return "", false
	}
	if m == nil {
		return "", true
	}
	var creds []byte
	if m.Credentials != "" {
		creds, _ = os.ReadFile(m.Credentials) // unreadable: the daemon refuses it, naming it
	}
	return m.Fingerprint(creds), true
}

// fleetFromConfig is the config file's [fleet] section for a daemon given
// no fleet URL: its URLs, and each setting its flag does not set.
func fleetFromConfig(changed func(flag string) bool, g *globals, m *fleetstate.Settings, maxBytes *string) ([]string, error) {
	root, err := control.PrepareRoot(g.stateDir)
	if err != nil {
		return nil, err
	}
	cfg, err := loadConfig(root)
	if err != nil || len(cfg.Fleet.URLs) == 0 {
		// A file nexus cannot use refuses only the commands that read
		// their settings from it, which say why; the daemon serves them
		// all.
		return nil, nil
	}
	f := cfg.Fleet
	for flag, set := range map[string]func(){
		"mirror-host":      func() { m.Host = cmp.Or(f.Host, m.Host) },
		"mirror-creds":     func() { m.Credentials = cmp.Or(f.Credentials, m.Credentials) },
		"mirror-domain":    func() { m.Domain = cmp.Or(f.Domain, m.Domain) },
		"mirror-replicas":  func() { m.Replicas = cmp.Or(f.Replicas, m.Replicas) },
		"mirror-max-bytes": func() { *maxBytes = cmp.Or(f.MaxBytes, *maxBytes) },
	} {
		if !changed(flag) {
			set()
		}
	}
	return f.URLs, nil
}

// mirrorFlags fills m from the daemon's --mirror flags. Its errors never
// repeat a password.
func mirrorFlags(m *fleetstate.Settings, urls []string, maxBytes string) error {
	for _, arg := range urls {
		for _, s := range strings.Split(arg, ",") {
			u, err := fleetstate.ParseURL(strings.TrimSpace(s))
			if err != nil {
				return fmt.Errorf("--mirror: %w", err)
			}
			m.URLs = append(m.URLs, u)
		}
	}
	if m.Host == "" {
		h, _ := os.Hostname()
		m.Host = fleetstate.HostNameFrom(h)
	} else if err := fleetstate.ValidHostName(m.Host); err != nil {
		return fmt.Errorf("--mirror-host: %w", err)
	}
	if m.Replicas < 0 || m.Replicas > 5 {
		return fmt.Errorf("--mirror-replicas %d: want 1 to 5", m.Replicas)
	}
	n, err := config.ParseBytes(maxBytes)
	if err != nil {
		return fmt.Errorf("--mirror-max-bytes %q: %w", maxBytes, err)
	}
	m.MaxBytes = n
	return nil
}

func eventsCmd(g *globals) *cobra.Command {
	var q events.Query
	var since, until string
	var all bool
	var o *output
	c := &cobra.Command{
		Use:   "events",
		Short: "Print what happened, one event a line: sandboxes, snapshots, volumes, exits, warnings (--all: the bookkeeping too)",
		Long: "Print the journal's events, one a line, oldest first, with a header on a terminal.\n" +
			"By default only what a person acts on or must know (sandboxes, snapshots, volumes, exits, warnings,\n" +
			"reaps, undone commands), each sandbox by its handle and each payload's plain fields.\n" +
			"--all adds the bookkeeping (intents, resources, flushes, sagas); --all and --type print whole payloads.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := eventsQuery(&q, since, until, time.Now()); err != nil {
				return usageError{err}
			}
			// The default view: the notable events, each payload's plain
			// fields. A selection of types or --all prints whole payloads.
			whole := all || q.Type != "" || len(q.Types) > 0
			if !whole {
				q.Types = events.Notable()
			}
			return withBackend(cmd.Context(), g, func(b control.Backend) error {
				ref := q.Sandbox
				if err := resolveEventSandbox(cmd.Context(), b, &q); err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				names := eventNames{b: b, o: o, handles: map[string]string{}}
				if ref != q.Sandbox && !strings.HasPrefix(q.Sandbox, ref) {
					names.handles[q.Sandbox] = ref // a removed sandbox, named by its handle
				}
				header := o.human() && isTerminal(out)
				err := b.Events(cmd.Context(), q, func(r events.Record) error {
					if header {
						fmt.Fprintln(out, eventHeader)
						header = false
					}
					return printStreamed(out, o, eventJSON(r), r.Event.ID.String(), func() string {
						return eventLine(r, names.of(cmd.Context(), r.Event), whole)
					})
				})
				if q.Follow && errors.Is(err, context.Canceled) {
					return nil // interrupted by the user: the normal end of --follow
				}
				return err
			})
		},
	}
	c.Flags().BoolVarP(&q.Follow, "follow", "f", false, "keep printing new events")
	c.Flags().StringVar(&since, "since", "", "start at a journal sequence (42), a time (RFC 3339) or an age (10m, 7d)")
	c.Flags().StringVar(&until, "until", "", "end at a journal sequence, a time or an age, as --since")
	c.Flags().IntVarP(&q.Tail, "tail", "n", 0, "only the last N events selected")
	c.Flags().StringVar(&q.Sandbox, "sandbox", "", "only events of this sandbox (ID or handle)")
	c.Flags().StringArrayVar(&q.Types, "type", nil, "only this event type (e.g. sandbox.created) or category (e.g. reap); repeats")
	c.Flags().BoolVar(&all, "all", false, "every event, the bookkeeping too (intents, resources, flushes, sagas); like --type, prints whole payloads with their saga and step")
	o = addOutput(c, true)
	addNoTrunc(c, o)
	c.Flags().Lookup("json").Usage = "one JSON object a line (see docs/json.md)"
	return c
}

// jsonEvent is client.Event with its payload as a value, so a --format
// template reaches its fields.
type jsonEvent struct {
	client.EventHeader
	Data events.Payload `json:"data"`
}

func eventJSON(r events.Record) jsonEvent {
	return jsonEvent{EventHeader: client.HeaderOf(r), Data: r.Event.Payload}
}

const eventHeader = "   SEQ  TIME                      TYPE                 SANDBOX                    DATA"

// eventLine is one event for people: its sandbox by handle when it has
// one; whole, its payload as JSON and its saga and step, else the
// payload's plain fields as key=value.
func eventLine(r events.Record, sandbox string, whole bool) string {
	e := r.Event
	data, _ := json.Marshal(e.Payload)
	if !whole {
		data = []byte(plainFields(data))
	}
	line := fmt.Sprintf("%6d  %s  %-20s %-26s %s", r.Seq, e.Time.UTC().Format("2006-01-02T15:04:05.000Z"), e.Type, sandbox, data)
	if whole && e.Saga != "" {
		line += "  saga=" + e.Saga + " step=" + e.Step
	}
	return line
}

// plainFields is a JSON object's strings, numbers and booleans as
// key=value in key order; lists and objects (resources, sockets) are left
// to --all and --json.
func plainFields(object []byte) string {
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(object))
	d.UseNumber()
	if d.Decode(&m) != nil {
		return string(object)
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch v := m[k].(type) {
		case string, json.Number, bool:
			out = append(out, fmt.Sprintf("%s=%v", k, v))
		}
	}
	return strings.Join(out, " ")
}

// isTerminal says w is a terminal: the daemon's log is text there, and a
// stream of events gets a header.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// eventNames names the sandboxes of printed events: the handle the event
// that made the sandbox gave, else the sandbox's as the backend knows it
// (looked up once per sandbox), else its ID as tables print IDs.
type eventNames struct {
	b       control.Backend
	o       *output
	handles map[string]string // sandbox ID -> handle, "" for none
}

func (n eventNames) of(ctx context.Context, e events.Event) string {
	if e.Sandbox == "" {
		return "-"
	}
	switch e.Type {
	case events.SandboxCreated, events.SandboxForked, events.SandboxRestored, events.SandboxRenamed:
		// The event that makes a sandbox gives its handle, or none, and
		// a rename its next: a read from the start looks no sandbox up.
		n.handles[e.Sandbox] = events.HandleOf(e)
	}
	h, known := n.handles[e.Sandbox]
	if !known {
		if sb, found, err := n.b.Sandbox(ctx, e.Sandbox); err == nil && found {
			h = sb.Handle
		}
		n.handles[e.Sandbox] = h
	}
	if h == "" {
		return n.o.id(e.Sandbox)
	}
	return h
}

// lsPage is how many sandboxes ls asks the backend for at a time: what
// the daemon encodes per answer and what this command holds at once.
const lsPage = 500

func lsCmd(g *globals) *cobra.Command {
	var o *output
	var limit int
	var after string
	var filterFlags []string
	c := &cobra.Command{
		Use:   "ls",
		Short: "List sandboxes",
		Long: "List sandboxes in ID order (oldest first), read a page at a time.\n" +
			"--limit N prints at most N; --after ID continues after the last ID a page printed.\n" +
			"--json, --format and -q print each page as it arrives; the table is aligned over all rows.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return usageError{fmt.Errorf("--limit %d: not a count", limit)}
			}
			after = strings.ToUpper(after) // IDs are ULIDs, any case
			filters, err := parseFilters(filterFlags, projections.SandboxFilters)
			if err != nil {
				return err
			}
			return withBackend(cmd.Context(), g, func(b control.Backend) error {
				out := cmd.OutOrStdout()
				if o.json && len(filters) == 0 {
					// The store's bytes, as they arrive.
					return b.ListJSON(cmd.Context(), out, after, limit)
				}
				var rows []jsonSandbox // the table's, aligned once
				printed := 0
				if o.json {
					fmt.Fprint(out, "[")
				}
				for {
					want := lsPage
					if limit > 0 && len(filters) == 0 {
						want = min(want, limit-printed)
					}
					if limit > 0 && printed == limit {
						break
					}
					page, err := b.SandboxPage(cmd.Context(), after, want)
					if err != nil {
						return err
					}
					// Filtered after the exits are observed: state and
					// ready are what the row shows.
					var kept []projections.Sandbox
					for _, sb := range session.ObserveExits(page) {
						if filters.Match(projections.SandboxFacts(sb)) && (limit == 0 || printed+len(kept) < limit) {
							kept = append(kept, sb)
						}
					}
					shown := sandboxesJSON(kept)
					switch {
					case o.json:
						for _, sb := range shown {
							// The same normalised value printJSON prints ([] never
							// null, UTC times), one item at a time.
							data, err := json.MarshalIndent(normalize(reflect.ValueOf(sb)).Interface(), "  ", "  ")
							if err != nil {
								return err
							}
							sep := ","
							if printed == 0 {
								sep = ""
							}
							fmt.Fprintf(out, "%s\n  %s", sep, data)
							printed++
						}
					case o.human():
						rows = append(rows, shown...)
						printed += len(shown)
					default:
						if err := printList(cmd, o, shown, sandboxID, sandboxTable(o, nil)); err != nil {
							return err
						}
						printed += len(shown)
					}
					if len(page) < want {
						break
					}
					after = page[len(page)-1].ID
				}
				if o.json {
					if printed > 0 {
						fmt.Fprint(out, "\n")
					}
					_, err := fmt.Fprintln(out, "]")
					return err
				}
				if o.human() {
					return printList(cmd, o, rows, sandboxID, sandboxTable(o, rows))
				}
				return nil
			})
		},
	}
	o = addOutput(c, true)
	addNoTrunc(c, o)
	c.Flags().IntVar(&limit, "limit", 0, "print at most this many sandboxes (0: all)")
	c.Flags().StringVar(&after, "after", "", "start after this sandbox ID (the last one a --limit page printed)")
	addFilterFlag(c, &filterFlags, projections.SandboxFilters)
	return c
}

func sandboxID(sb jsonSandbox) string { return sb.ID }

// addFilterFlag adds the repeatable --filter KEY=VALUE of a listing that
// takes the keys valid (projections.ParseFilters).
func addFilterFlag(c *cobra.Command, to *[]string, valid []projections.FilterKey) {
	keys := make([]string, len(valid))
	for i, k := range valid {
		keys[i] = string(k) + "=..."
	}
	c.Flags().StringArrayVar(to, "filter", nil, "list only what matches KEY=VALUE ("+strings.Join(keys, ", ")+"; label=K or label=K=V); several must all match")
}

// parseFilters reads --filter flags; a bad one is a usage error.
func parseFilters(flags []string, valid []projections.FilterKey) (projections.Filters, error) {
	fs, err := projections.ParseFilters(flags, valid)
	if err != nil {
		return nil, usageError{fmt.Errorf("--%w", err)}
	}
	return fs, nil
}

// sandboxTable is ls's table. PARENT is the sandbox a fork or restore
// child came from: its handle when it is among rows and has one, else its
// ID as the table prints IDs.
func sandboxTable(o *output, rows []jsonSandbox) table[jsonSandbox] {
	handles := map[string]string{}
	for _, sb := range rows {
		if sb.Handle != "" {
			handles[sb.ID] = sb.Handle
		}
	}
	return table[jsonSandbox]{
		header: []string{"ID", "HANDLE", "STATE", "READY", "IMAGE", "DRIVER", "PARENT", "CREATED"},
		row: func(sb jsonSandbox) []string {
			parent := handles[sb.Parent]
			if parent == "" {
				parent = o.id(sb.Parent)
			}
			return []string{o.id(sb.ID), sb.Handle, string(sb.State), readyCell(sb), sb.Image, sb.Driver, parent, age(sb.CreatedAt)}
		},
		labels: func(sb jsonSandbox) events.Labels { return sb.Labels },
	}
}

// readyCell is the READY column: true, the reason a running sandbox is
// not Ready, or empty (a dash) for one that does not run.
func readyCell(sb jsonSandbox) string {
	switch {
	case sb.Ready:
		return "true"
	case sb.ReadyReason == projections.ReasonNotRunning:
		return ""
	}
	return "false:" + sb.ReadyReason
}

func inspectCmd(g *globals) *cobra.Command {
	var o *output
	c := &cobra.Command{
		Use:   "inspect ID|HANDLE...",
		Short: "Show sandboxes (--json prints an array, as docker does)",
		Args:  minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withBackend(cmd.Context(), g, func(b control.Backend) error {
				// Each sandbox by its own lookup, not the list of all of them.
				found := []projections.Sandbox{}
				err := eachRef(cmd, args, func(ref string) error {
					sb, err := session.Lookup(cmd.Context(), b, ref)
					if err != nil {
						return err
					}
					found = append(found, session.ObserveExits([]projections.Sandbox{sb})[0])
					return nil
				})
				if !o.human() {
					return errors.Join(err, printList(cmd, o, sandboxesJSON(found), sandboxID, sandboxTable(o, nil)))
				}
				for i, sb := range found {
					if i > 0 {
						fmt.Fprintln(cmd.OutOrStdout())
					}
					printSandbox(cmd.OutOrStdout(), sb)
				}
				return err
			})
		},
	}
	o = addOutput(c, true)
	return c
}

func printSandbox(w io.Writer, sb projections.Sandbox) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ID:\t%s\nHandle:\t%s\nState:\t%s\nImage:\t%s\nDriver:\t%s\nCreated:\t%s\nUpdated:\t%s\n",
		sb.ID, dash(sb.Handle), sb.State, dash(sb.Image), dash(sb.Driver), sb.CreatedAt.UTC().Format(time.RFC3339Nano), sb.UpdatedAt.UTC().Format(time.RFC3339Nano))
	if b := sb.BootConfig; !b.IsZero() {
		fmt.Fprintf(tw, "Size:\t%d vCPUs, %s\n", b.Cpus, formatSize(b.MemoryBytes))
		fmt.Fprintf(tw, "Kernel:\t%s\n", dash(b.Kernel))
		if b.Initramfs != "" {
			fmt.Fprintf(tw, "Initramfs:\t%s\n", b.Initramfs)
		}
		fmt.Fprintf(tw, "Cmdline:\t%s\n", dash(b.Cmdline))
	}
	fmt.Fprintf(tw, "Root:\t%s\n", rootLine(sb.BootConfig.RootMode()))
	if sb.Parent != "" {
		fmt.Fprintf(tw, "Parent:\t%s\n", sb.Parent)
	}
	if len(sb.Labels) > 0 {
		fmt.Fprintf(tw, "Labels:\t%s\n", labelsText(sb.Labels))
	}
	if sb.VMM != nil {
		fmt.Fprintf(tw, "VMM:\tpid %d (start %d)%s\n", sb.VMM.Pid, sb.VMM.StartTicks, exitedNote(sb.VMM))
	}
	if sb.Supervisor != nil {
		fmt.Fprintf(tw, "Supervisor:\tpid %d (start %d)%s\n", sb.Supervisor.Pid, sb.Supervisor.StartTicks, exitedNote(sb.Supervisor))
	}
	switch ready, why := sb.Readiness(); {
	case ready:
		fmt.Fprintf(tw, "Ready:\tTrue (booted %s, Ready %s later)\n", sb.BootAt.UTC().Format(time.RFC3339Nano), sb.ReadyAt.Sub(sb.BootAt).Round(time.Millisecond))
	default:
		fmt.Fprintf(tw, "Ready:\tFalse reason=%s\n", why)
	}
	for _, v := range sb.Volumes {
		fmt.Fprintf(tw, "Volume:\t%s at %s\n", v.Name, v.GuestPath)
	}
	for _, c := range sb.Conditions {
		fmt.Fprintf(tw, "Condition:\t%s=%s reason=%s: %s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	fmt.Fprintf(tw, "Journal seq:\t%d\n", sb.Seq)
	return tw.Flush()
}

func exitedNote(p *projections.Process) string {
	if p.Exited {
		return " exited"
	}
	return ""
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// daemonStatus is `daemon status --json`: the daemon's own answer and
// this nexus's build beside it.
type daemonStatus struct {
	Pid           int         `json:"pid"`
	Root          string      `json:"root"`
	Auto          bool        `json:"auto"`
	Retiring      bool        `json:"retiring"`
	SubscriberURL string      `json:"subscriber_url,omitempty"`
	Build         *wire.Build `json:"build"`
	This          *wire.Build `json:"this"`
	SameBuild     bool        `json:"same_build"`
}

func daemonStatusCmd(g *globals) *cobra.Command {
	var o *output
	c := &cobra.Command{
		Use:   "status",
		Short: "Show the state root's daemon: pid, how it was started, and the nexus build it runs",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := control.DaemonStatus(cmd.Context(), g.stateDir)
			if err != nil {
				return err
			}
			self, serr := control.SelfBuild()
			v := daemonStatus{Pid: st.Pid, Root: st.Root, Auto: st.Auto, Retiring: st.Retiring,
				SubscriberURL: st.SubscriberURL, Build: st.Build}
			if serr == nil {
				v.This = &self
				v.SameBuild = st.Build != nil && st.Build.Same(self)
			}
			return printValue(cmd, o, v, nil, func(w io.Writer) { printDaemonStatus(w, st, self, serr) })
		},
	}
	o = addOutput(c, false)
	return c
}

func daemonMetricsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "metrics",
		Short: "Print the daemon's Prometheus metrics, as a scrape of /metrics on nexus.sock gets them (docs/metrics.md)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return control.DaemonMetrics(cmd.Context(), g.stateDir, cmd.OutOrStdout())
		},
	}
}

// daemonStopped is `daemon stop --json`.
type daemonStopped struct {
	Pid  int    `json:"pid"`
	Root string `json:"root"`
}

func daemonStopCmd(g *globals) *cobra.Command {
	var o *output
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "stop",
		Short: "Stop the state root's daemon once it has finished the commands it is running (however it was started)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			st, err := control.StopDaemon(ctx, g.stateDir)
			if err != nil {
				return err
			}
			v := daemonStopped{Pid: st.Pid, Root: st.Root}
			return printValue(cmd, o, v, nil, func(w io.Writer) { fmt.Fprintf(w, "stopped the daemon of %s (pid %d)\n", st.Root, st.Pid) })
		},
	}
	c.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the daemon's running commands to end")
	o = addOutput(c, false)
	return c
}

func printDaemonStatus(w io.Writer, st wire.Status, self wire.Build, selfErr error) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "pid\t%d\n", st.Pid)
	fmt.Fprintf(tw, "root\t%s\n", st.Root)
	started := "by hand"
	if st.Auto {
		started = "on demand (exits when idle)"
	}
	fmt.Fprintf(tw, "started\t%s\n", started)
	state := "serving"
	if st.Retiring {
		state = "retiring (finishing with its commands)"
	}
	fmt.Fprintf(tw, "state\t%s\n", state)
	build := "not reported (a nexus older than build identities)"
	if st.Build != nil {
		build = st.Build.String()
	}
	fmt.Fprintf(tw, "build\t%s\n", build)
	switch {
	case selfErr != nil:
		fmt.Fprintf(tw, "this nexus\tunknown: %v\n", selfErr)
	case st.Build != nil && st.Build.Same(self):
		fmt.Fprintf(tw, "this nexus\tthe same build\n")
	case st.Auto:
		fmt.Fprintf(tw, "this nexus\t%s: another build; its next command replaces the daemon\n", self)
	default:
		fmt.Fprintf(tw, "this nexus\t%s: another build; its commands refuse the daemon until it is restarted\n", self)
	}
	if st.SubscriberURL != "" {
		fmt.Fprintf(tw, "subscribers\t%s\n", st.SubscriberURL)
	}
	tw.Flush()
}

// rootLine says how a sandbox's guest root is made, for inspect.
func rootLine(mode string) string {
	if mode == events.RootOverlay {
		return "overlay (the image cache entry, shared read-only; writes on the workspace disk)"
	}
	return "copy (a private copy of the OS disk)"
}
