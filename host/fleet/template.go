package fleet

import (
	"fmt"
	"sort"
	"strings"
)

// Template is what `nexus fleet template` prints: the accounts block a
// fleet operator adds to every node's nats-server configuration.
//
// Each host gets an account of its own, so isolation is by construction,
// not by subject filters: a host's identity sees only its own account,
// where the only stream is its mirror, and may not delete or purge even
// that. Its user is for leaf-node links only, so its password is useless
// as a client. Auditors get one account that imports, from every host
// account, only the requests that read a stream (info, get by sequence,
// and the consumer the aggregate sources through): they can read every
// mirror and change none. Their own JetStream holds only the aggregate
// (AggregateStream), which they may create and extend but not delete or purge.
type Template struct {
	// Hosts are the fleet's host names (ValidHostName).
	Hosts []string
	// Auditor is the auditors' user name.
	Auditor string
	// MaxBytes limits each host account's JetStream storage (0: none).
	MaxBytes int64
}

// HostAccount is the fleet account a host's link is bound to.
func HostAccount(host string) string { return MirrorStream(host) }

// AuditAccount holds the auditors.
const AuditAccount = "NEXUS_AUDIT"

// PasswordVar is the environment variable the template reads a user's
// password from (nats-server resolves $NAME from its environment), so no
// password is ever written into the file or printed.
func PasswordVar(user string) string {
	return "NEXUS_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_")) + "_PASSWORD"
}

// hostDenied: what a host may not ask of its own account's JetStream. The
// same API is reachable without a domain and through the fleet's domain,
// so both spellings are denied.
func hostDenied(domain string) []string {
	var deny []string
	for _, prefix := range []string{"$JS.API.", "$JS." + domain + ".API."} {
		for _, api := range []string{
			"STREAM.DELETE.>", "STREAM.PURGE.>", "STREAM.MSG.DELETE.>", "STREAM.RESTORE.>",
			"STREAM.SNAPSHOT.>", "STREAM.PEER.>", "CONSUMER.DELETE.>", "ACCOUNT.>", "META.>", "SERVER.>",
		} {
			deny = append(deny, prefix+api)
		}
	}
	// The aggregate's deliveries come from the account's JetStream; a
	// host publishing there itself would forge its part of the aggregate.
	return append(deny, "$NEXUS.AGG.>")
}

// AuditAPIPrefix is the JetStream API prefix auditors use
// (jetstream.NewWithAPIPrefix, natscli --js-api-prefix). The imports land
// there, not on $JS.API, where the audit account's own (disabled)
// JetStream would answer the same request first.
const AuditAPIPrefix = "$NEXUS.AUDIT.API"

// readAPIs are the JetStream requests an auditor may send for a stream:
// info, get by sequence, and the consumer the aggregate sources through
// (a consumer reads; nothing in a mirror can be changed through one).
func readAPIs(stream string) []string {
	return []string{"STREAM.INFO." + stream, "STREAM.MSG.GET." + stream, "CONSUMER.CREATE." + stream}
}

// aggregateFlowControl is the flow-control reply subject of the source
// consumer on a host's mirror (its consumer's "$JS.FC.<stream>.>" form),
// which the aggregate answers from the auditors' account.
func aggregateFlowControl(stream string) string { return "$JS.FC." + stream + ".>" }

// auditorAllowed: what an auditor may publish: the imported reads, and in
// its own account only the requests that create, extend and read the
// aggregate; never its delete or purge.
func auditorAllowed() []string {
	js := "$JS.API."
	return []string{
		AuditAPIPrefix + ".>",
		js + "STREAM.CREATE." + AggregateStream, js + "STREAM.UPDATE." + AggregateStream, js + "STREAM.INFO." + AggregateStream,
		js + "STREAM.MSG.GET." + AggregateStream, js + "DIRECT.GET." + AggregateStream, js + "DIRECT.GET." + AggregateStream + ".>",
		js + "CONSUMER.*." + AggregateStream, js + "CONSUMER.*." + AggregateStream + ".>", js + "CONSUMER.MSG.NEXT." + AggregateStream + ".>",
	}
}

// Config renders the template for the fleet's JetStream domain.
func (t Template) Config(domain string) (string, error) {
	if len(t.Hosts) == 0 {
		return "", fmt.Errorf("fleet template: name at least one host")
	}
	if err := ValidHostName(t.Auditor); err != nil {
		return "", fmt.Errorf("fleet template: auditor %w", err)
	}
	hosts := append([]string(nil), t.Hosts...)
	sort.Strings(hosts)
	for i, h := range hosts {
		if err := ValidHostName(h); err != nil {
			return "", fmt.Errorf("fleet template: %w", err)
		}
		if i > 0 && hosts[i-1] == h {
			return "", fmt.Errorf("fleet template: host %q named twice", h)
		}
		if h == t.Auditor {
			return "", fmt.Errorf("fleet template: %q is both a host and the auditor", h)
		}
	}
	js := "enabled"
	if t.MaxBytes > 0 {
		js = fmt.Sprintf("{ max_file: %d, max_mem: 0 }", t.MaxBytes)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# nexus fleet template: merge into every node's configuration (jetstream { domain: %s }).\n", domain)
	b.WriteString("# Passwords come from each node's environment; set every variable named below.\n")
	fmt.Fprintf(&b, "# Host users link as leaf nodes only; auditors read with the JetStream API prefix %s.\n", AuditAPIPrefix)
	b.WriteString("accounts {\n")
	for _, h := range hosts {
		acc, stream := HostAccount(h), MirrorStream(h)
		fmt.Fprintf(&b, "  %s: {\n    jetstream: %s\n", acc, js)
		fmt.Fprintf(&b, "    users: [{\n      user: %q, password: $%s\n", h, PasswordVar(h))
		b.WriteString("      allowed_connection_types: [\"LEAFNODE\"]\n")
		fmt.Fprintf(&b, "      permissions: { publish: { deny: %s } }\n    }]\n", list(hostDenied(domain)))
		b.WriteString("    exports: [\n")
		for _, s := range readAPIs(stream) {
			fmt.Fprintf(&b, "      { service: %q, accounts: [%s] }\n", "$JS.API."+s, AuditAccount)
		}
		fmt.Fprintf(&b, "      { service: %q, accounts: [%s] }\n", aggregateFlowControl(stream), AuditAccount)
		fmt.Fprintf(&b, "      { stream: %q, accounts: [%s] }\n", aggregateDeliver(h)+".>", AuditAccount)
		b.WriteString("    ]\n  }\n")
	}
	// The auditors' account holds the aggregate (AggregateStream) and nothing
	// else its users may write.
	fmt.Fprintf(&b, "  %s: {\n    jetstream: enabled\n", AuditAccount)
	fmt.Fprintf(&b, "    users: [{ user: %q, password: $%s, permissions: { publish: { allow: %s }, subscribe: { allow: [\"_INBOX.>\"] } } }]\n",
		t.Auditor, PasswordVar(t.Auditor), list(auditorAllowed()))
	b.WriteString("    imports: [\n")
	for _, h := range hosts {
		for _, s := range readAPIs(MirrorStream(h)) {
			fmt.Fprintf(&b, "      { service: { account: %s, subject: %q }, to: %q }\n", HostAccount(h), "$JS.API."+s, AuditAPIPrefix+"."+s)
		}
		fc := aggregateFlowControl(MirrorStream(h))
		fmt.Fprintf(&b, "      { service: { account: %s, subject: %q } }\n", HostAccount(h), fc)
		fmt.Fprintf(&b, "      { stream: { account: %s, subject: %q } }\n", HostAccount(h), aggregateDeliver(h)+".>")
	}
	b.WriteString("    ]\n  }\n}\n")
	return b.String(), nil
}

func list(items []string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
