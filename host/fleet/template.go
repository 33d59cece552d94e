package fleet

import (
	"fmt"
	"sort"
	"strings"

	"github.com/nexus-sandbox/nexus/host/fleetstate"
)

// Template is what `nexus fleet template` prints: the accounts block a
// fleet operator adds to every node's nats-server configuration.
//
// Each identity can do its part and nothing more:
//
//   - A host has an account of its own, so isolation is by construction.
//     Its user links as a leaf node only and may publish only what its
//     mirror needs: the creation and info of its mirror and of its report
//     stream (ReportStream), its report, the mirror's deliveries, and
//     the get by sequence that holds its mirror to its journal's digest
//     (`fleet status`) and reads its last report back. It
//     can neither update nor delete either stream, and the account's
//     JetStream limits (streams, storage) bound it even where a
//     permission would not.
//   - Auditors read: every mirror and report through imports of the read
//     requests only (info, get by sequence, the consumer the aggregate
//     sources through), and the aggregate by info, get, direct get and
//     ordered consumers. No stream create, update, delete or purge.
//   - The aggregator creates the aggregate (AggregateStream), adds hosts
//     to it, keeps its sources' resume points and may step its leader
//     down (KeepAggregate); it cannot delete or purge it, nor touch a
//     mirror.
//   - The operator repairs: it may update or delete the aggregate and,
//     through imports of those requests, each host's mirror and report.
type Template struct {
	// Hosts are the fleet's host names (ValidHostName).
	Hosts []string
	// Auditor, Aggregator and Operator are those users' names; empty
	// Aggregator and Operator are "aggregator" and "operator".
	Auditor, Aggregator, Operator string
	// MaxBytes limits each host account's JetStream storage (0: none).
	MaxBytes int64
	// MaxStreams limits each host account's streams (0: none); a host
	// needs 2, its mirror and its report.
	MaxStreams int
}

// HostAccount is the fleet account a host's link is bound to.
func HostAccount(host string) string { return MirrorStream(host) }

// AuditAccount holds the auditors, the aggregator, the operator and the
// aggregate.
const AuditAccount = "NEXUS_AUDIT"

// PasswordVar is the environment variable the template reads a user's
// password from (nats-server resolves $NAME from its environment), so no
// password is ever written into the file or printed.
func PasswordVar(user string) string {
	return "NEXUS_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_")) + "_PASSWORD"
}

// hostStreams is how many streams a host makes: its mirror and its report.
const hostStreams = 2

// hostAllowed: all a host's link may publish into its account. The same
// JetStream API is reachable without a domain and through the fleet's
// domain, so both spellings name the host's two streams. $JS.M and $JSC.R
// are the mirror's deliveries and the answers to the fleet's consumer
// requests, which cross the link from the host's journal.
func hostAllowed(host, domain string) []string {
	var allow []string
	for _, prefix := range []string{"$JS.API.", "$JS." + domain + ".API."} {
		m, r := MirrorStream(host), ReportStream(host)
		allow = append(allow, prefix+"STREAM.CREATE."+m, prefix+"STREAM.INFO."+m, prefix+"STREAM.MSG.GET."+m,
			prefix+"STREAM.CREATE."+r, prefix+"STREAM.INFO."+r, prefix+"STREAM.MSG.GET."+r)
	}
	return append(allow, ReportSubject, "$JS.M.>", "$JSC.R.>")
}

// AuditAPIPrefix is the JetStream API prefix auditors use
// (fleetstate.AuditAPIPrefix).
const AuditAPIPrefix = fleetstate.AuditAPIPrefix

// OperatorAPIPrefix is where the operator reaches the requests that
// repair a host's mirror and report (update, delete), imported from each
// host account; only the operator may publish there.
const OperatorAPIPrefix = "$NEXUS.OPERATOR.API"

// readAPIs are the JetStream requests an auditor may send for a host:
// info and get by sequence of its mirror and its report, and the consumer
// the aggregate sources the mirror through (a consumer reads; nothing in a
// mirror can be changed through one).
func readAPIs(host string) []string {
	m, r := MirrorStream(host), ReportStream(host)
	return []string{"STREAM.INFO." + m, "STREAM.MSG.GET." + m, "CONSUMER.CREATE." + m, "STREAM.INFO." + r, "STREAM.MSG.GET." + r}
}

// repairAPIs are the requests the operator may send for a host's streams.
func repairAPIs(host string) []string {
	m, r := MirrorStream(host), ReportStream(host)
	return []string{"STREAM.UPDATE." + m, "STREAM.DELETE." + m, "STREAM.UPDATE." + r, "STREAM.DELETE." + r}
}

// aggregateFlowControl is the flow-control reply subject of the source
// consumer on a host's mirror (its consumer's "$JS.FC.<stream>.>" form),
// which the aggregate answers from the auditors' account.
func aggregateFlowControl(stream string) string { return "$JS.FC." + stream + ".>" }

// aggregateReads are the requests that read the aggregate: info, get,
// direct get, and the ordered consumers reads make (created, asked for
// messages, deleted when the read ends).
func aggregateReads() []string {
	js, a := "$JS.API.", AggregateStream
	return []string{
		js + "STREAM.INFO." + a, js + "STREAM.MSG.GET." + a, js + "DIRECT.GET." + a, js + "DIRECT.GET." + a + ".>",
		js + "CONSUMER.CREATE." + a, js + "CONSUMER.CREATE." + a + ".>", js + "CONSUMER.INFO." + a + ".>",
		js + "CONSUMER.DELETE." + a + ".>", js + "CONSUMER.MSG.NEXT." + a + ".>",
	}
}

// auditorAllowed: the imported reads of the mirrors and reports, and the
// reads of the aggregate.
func auditorAllowed() []string {
	return append([]string{AuditAPIPrefix + ".>"}, aggregateReads()...)
}

// aggregatorAllowed: the aggregate's creation and updates (its sources
// and their resume points), its leader's step-down (which sets its
// sources up again, KeepAggregate), and its reads; never its delete or
// purge.
func aggregatorAllowed() []string {
	js, a := "$JS.API.", AggregateStream
	return append([]string{js + "STREAM.CREATE." + a, js + "STREAM.UPDATE." + a, stepDownSubject}, auditorAllowed()...)
}

// operatorAllowed: every request on the aggregate, the repairs of every
// host's streams, and the auditors' reads.
func operatorAllowed() []string {
	js, a := "$JS.API.", AggregateStream
	return append([]string{js + "STREAM.*." + a, js + "STREAM.MSG.*." + a, stepDownSubject, js + "CONSUMER.>", OperatorAPIPrefix + ".>"}, auditorAllowed()...)
}

// Config renders the template for the fleet's JetStream domain.
func (t Template) Config(domain string) (string, error) {
	if len(t.Hosts) == 0 {
		return "", fmt.Errorf("fleet template: name at least one host")
	}
	if t.Aggregator == "" {
		t.Aggregator = "aggregator"
	}
	if t.Operator == "" {
		t.Operator = "operator"
	}
	if t.MaxStreams != 0 && t.MaxStreams < hostStreams {
		return "", fmt.Errorf("fleet template: max streams %d: a host needs %d (its mirror and its report)", t.MaxStreams, hostStreams)
	}
	roles := map[string]string{}
	for role, name := range map[string]string{"auditor": t.Auditor, "aggregator": t.Aggregator, "operator": t.Operator} {
		if err := fleetstate.ValidHostName(name); err != nil {
			return "", fmt.Errorf("fleet template: %s %w", role, err)
		}
		if other, ok := roles[name]; ok {
			return "", fmt.Errorf("fleet template: %q is both the %s and the %s", name, other, role)
		}
		roles[name] = role
	}
	hosts := append([]string(nil), t.Hosts...)
	sort.Strings(hosts)
	for i, h := range hosts {
		if err := fleetstate.ValidHostName(h); err != nil {
			return "", fmt.Errorf("fleet template: %w", err)
		}
		if i > 0 && hosts[i-1] == h {
			return "", fmt.Errorf("fleet template: host %q named twice", h)
		}
		if role, ok := roles[h]; ok {
			return "", fmt.Errorf("fleet template: %q is both a host and the %s", h, role)
		}
	}
	var limits []string
	if t.MaxBytes > 0 {
		limits = append(limits, fmt.Sprintf("max_file: %d, max_mem: 0", t.MaxBytes))
	}
	if t.MaxStreams > 0 {
		limits = append(limits, fmt.Sprintf("max_streams: %d", t.MaxStreams))
	}
	js := "enabled"
	if len(limits) > 0 {
		js = "{ " + strings.Join(limits, ", ") + " }"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# nexus fleet template: merge into every node's configuration (jetstream { domain: %s }).\n", domain)
	b.WriteString("# Passwords come from each node's environment; set every variable named below.\n")
	fmt.Fprintf(&b, "# Host users link as leaf nodes only; the auditor, aggregator and operator use the JetStream API prefix %s for the hosts' streams,\n", AuditAPIPrefix)
	fmt.Fprintf(&b, "# and the operator %s to repair them.\n", OperatorAPIPrefix)
	b.WriteString("accounts {\n")
	for _, h := range hosts {
		acc := HostAccount(h)
		fmt.Fprintf(&b, "  %s: {\n    jetstream: %s\n", acc, js)
		fmt.Fprintf(&b, "    users: [{\n      user: %q, password: $%s\n", h, PasswordVar(h))
		b.WriteString("      allowed_connection_types: [\"LEAFNODE\"]\n")
		fmt.Fprintf(&b, "      permissions: { publish: { allow: %s } }\n    }]\n", list(hostAllowed(h, domain)))
		b.WriteString("    exports: [\n")
		for _, s := range append(readAPIs(h), repairAPIs(h)...) {
			fmt.Fprintf(&b, "      { service: %q, accounts: [%s] }\n", "$JS.API."+s, AuditAccount)
		}
		fmt.Fprintf(&b, "      { service: %q, accounts: [%s] }\n", aggregateFlowControl(MirrorStream(h)), AuditAccount)
		fmt.Fprintf(&b, "      { stream: %q, accounts: [%s] }\n", aggregateDeliver(h)+".>", AuditAccount)
		b.WriteString("    ]\n  }\n")
	}
	// The auditors' account holds the aggregate (AggregateStream) and no
	// other stream its users may make.
	fmt.Fprintf(&b, "  %s: {\n    jetstream: enabled\n    users: [\n", AuditAccount)
	for _, u := range []struct {
		name  string
		allow []string
	}{{t.Auditor, auditorAllowed()}, {t.Aggregator, aggregatorAllowed()}, {t.Operator, operatorAllowed()}} {
		fmt.Fprintf(&b, "      { user: %q, password: $%s, permissions: { publish: { allow: %s }, subscribe: { allow: [\"_INBOX.>\"] } } }\n",
			u.name, PasswordVar(u.name), list(u.allow))
	}
	b.WriteString("    ]\n    imports: [\n")
	for _, h := range hosts {
		for _, s := range readAPIs(h) {
			fmt.Fprintf(&b, "      { service: { account: %s, subject: %q }, to: %q }\n", HostAccount(h), "$JS.API."+s, AuditAPIPrefix+"."+s)
		}
		for _, s := range repairAPIs(h) {
			fmt.Fprintf(&b, "      { service: { account: %s, subject: %q }, to: %q }\n", HostAccount(h), "$JS.API."+s, OperatorAPIPrefix+"."+s)
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
