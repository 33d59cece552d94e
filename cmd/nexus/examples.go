package main

import (
	"strings"

	"github.com/spf13/cobra"
)

// examples are the help examples of every command, by path below the root.
// They live in one table so that the test which requires one per command
// reads them where they are written.
var examples = map[string][]string{
	"create": {
		"nexus create --image debian.raw --handle web/1",
		"nexus create --image debian.raw --workspace ./src --volume cache:/var/cache --json",
	},
	"fork":        {"nexus fork web/1 --count 4", "nexus fork web/1 --count 3 --handle 'web/child-{n}'", "nexus fork web/1 --readonly-volumes --json"},
	"snapshot":    {"snap=$(nexus snapshot web/1)", "nexus snapshot web/1 --json"},
	"restore":     {"nexus restore \"$snap\"", "nexus restore \"$snap\" --json"},
	"rename":      {"nexus rename web/1 web/old", "nexus rename 01JF3QK2 api --json"},
	"start":       {"nexus start web/1", "nexus start web/1 --accept-unflushed", "nexus start --wait-timeout 10m web/1"},
	"stop":        {"nexus stop web/1", "nexus stop web/1 web/2 01JF3QK2"},
	"wait":        {"nexus wait web/1", "nexus wait --for stopped --timeout 30s web/1 web/2", "nexus create --image os.raw --no-wait -q | xargs nexus wait --for ready"},
	"rm":          {"nexus rm web/1", "nexus rm -f web/1 web/2", "nexus rm --with-snapshots 01JF3QK2", "nexus rm -f --with-snapshots --dry-run web/1"},
	"snapshot ls": {"nexus snapshot ls", "nexus snapshot ls web/1 --json"},
	"snapshot rm": {"nexus snapshot rm \"$snap\"", "nexus snapshot rm 01JF3QX7 01JF3QY2", "nexus snapshot rm --dry-run 01JF3QX7"},
	"recover":     {"nexus recover", "nexus recover --json"},
	"ls":          {"nexus ls", "nexus ls --json", "nexus ls -q", "nexus ls --format '{{.ID}} {{.State}}'"},
	"exec":        {"nexus exec web/1 -- uname -a", "nexus exec -i --env LANG=C.UTF-8 -w /workspace web/1 -- sh -c 'wc -l'"},
	"cp":          {"nexus cp web/1:/workspace/out.log ./out.log", "nexus cp ./input.csv web/1:/workspace/input.csv"},
	"logs":        {"nexus logs web/1", "nexus logs web/1 --log vmm --follow"},
	"inspect":     {"nexus inspect web/1", "nexus inspect 01JF3QK2 web/2 --json"},
	"events": {
		"nexus events --follow",
		"nexus events --since 10m --type sandbox --type vmm.exited",
		"nexus events --sandbox web/1 --tail 20 --follow --json",
	},
	"daemon status":  {"nexus daemon status", "nexus daemon status --json"},
	"daemon stop":    {"nexus daemon stop", "nexus daemon stop --timeout 30s"},
	"daemon metrics": {"nexus daemon metrics", "nexus daemon metrics | grep nexus_sagas_total"},
	"daemon": {
		"nexus daemon --idle 10m",
		"nexus daemon --listen 127.0.0.1:4222",
		"nexus daemon --listen 0.0.0.0:4443 --allow-remote --tls-cert host.pem --tls-key host.key",
		"nexus daemon --mirror nats-leaf://hub:7422 --mirror-creds host.creds --mirror-host rack1-07",
	},
	"reap": {
		"nexus reap",
		"nexus reap --kind overlay --older-than 7d --json > plan.json",
		"nexus reap --apply --plan plan.json",
	},
	"run":               {"nexus run -- make integration-test", "nexus run --keep -- ./provision.sh"},
	"volume":            {"nexus volume create cache --size 2G", "nexus volume ls"},
	"volume create":     {"nexus volume create cache --size 2G", "nexus volume create scratch --size 512M --json"},
	"volume ls":         {"nexus volume ls", "nexus volume ls --json"},
	"volume prune":      {"nexus volume prune", "nexus volume prune --apply", "nexus volume prune --include-detached", "nexus volume prune --apply --include-detached --yes"},
	"volume rm":         {"nexus volume rm cache", "nexus volume rm --yes cache", "nexus volume rm --dry-run cache"},
	"replay":            {"nexus replay verify", "nexus replay timeline web/1"},
	"replay at":         {"nexus replay at 1200", "nexus replay at 2026-12-01T09:30:00Z"},
	"replay diff":       {"nexus replay diff"},
	"replay timeline":   {"nexus replay timeline web/1"},
	"replay verify":     {"nexus replay verify", "nexus replay verify --nats nats://audit@hub:4222 --stream NEXUS_RACK1_07"},
	"image-cache":       {"nexus image-cache list", "nexus image-cache prune --unused --dry-run"},
	"image-cache list":  {"nexus image-cache list", "nexus image-cache list --json"},
	"image-cache prune": {"nexus image-cache prune --unused --dry-run", "nexus image-cache prune --unused --older-than 7d", "nexus image-cache prune --unused --max-bytes 20G"},
	"journal":           {"nexus journal repair --backup /var/tmp/journal-copy"},
	"journal repair":    {"nexus journal repair --backup /var/tmp/journal-copy", "nexus journal repair --backup ./copy --json"},
	"ledger":            {"nexus ledger ls", "nexus ledger sweep"},
	"ledger ls":         {"nexus ledger ls", "nexus ledger ls --json"},
	"ledger sweep":      {"nexus ledger sweep", "nexus ledger sweep --json"},
	"config":            {"nexus config show"},
	"guest":             {"nexus guest initramfs --kernel-release $(uname -r) -o initrd.gz"},
	"guest initramfs": {
		"nexus guest initramfs --kernel-release 6.1.0-27-cloud-amd64 -o /var/lib/nexus/initrd.gz",
		"CGO_ENABLED=0 go build -o nexus-init ./cmd/nexus-init && nexus guest initramfs --kernel-release 6.1.0-27-cloud-amd64 -o initrd.gz --agent ./nexus-init",
	},
	"config show":     {"nexus config show", "NEXUS_CONFIG=/etc/nexus.toml nexus config show --json"},
	"version":         {"nexus version", "nexus version --json", "nexus --version"},
	"docs":            {"nexus docs man ./man"},
	"fleet":           {"nexus fleet status", "nexus fleet template --host rack1-07 --host rack1-08"},
	"fleet status":    {"nexus fleet status", "nexus fleet status --json"},
	"fleet template":  {"nexus fleet template --host rack1-07,rack1-08 > fleet-accounts.conf", "nexus fleet template --host rack1-07 --max-bytes 20G --auditor audit"},
	"fleet aggregate": {"NEXUS_FLEET_URL=nats://auditor:PASS@fleet1:4222 nexus fleet aggregate --host rack1-07,rack1-08", "nexus fleet aggregate --host rack1-09 --nats-creds auditor.creds --nats nats://fleet1:4222"},
	"fleet events":    {"nexus fleet events --since 1h --type sandbox", "nexus fleet events --host rack1-07 --sandbox web --follow --json"},
	"fleet find":      {"nexus fleet find web", "nexus fleet find 01JDQ4Z6X1M9A3Y0C5TB2R8NKW --json"},
	"fleet timeline":  {"nexus fleet timeline web", "nexus fleet timeline 01JDQ4Z6X1M9A3Y0C5TB2R8NKW --json"},
	"docs man":        {"nexus docs man /usr/local/share/man/man1"},
}

// addExamples sets each command's Example from the table, indented the way
// cobra prints it.
func addExamples(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if ex, ok := examples[commandKey(c)]; ok {
			c.Example = "  " + strings.Join(ex, "\n  ")
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// commandKey is a command's path below the root: "volume create".
func commandKey(c *cobra.Command) string {
	return strings.TrimPrefix(c.CommandPath(), c.Root().Name()+" ")
}
