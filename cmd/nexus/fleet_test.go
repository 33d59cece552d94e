package main

import (
	"strings"
	"testing"
)

// Every mirror misconfiguration is a one-line error at daemon start,
// never "mirroring" followed by nothing, and no message shows a password.
func TestDaemonMirrorMisconfiguration(t *testing.T) {
	root := t.TempDir()
	for _, c := range []struct {
		args    []string
		code    int
		mention string
	}{
		{[]string{"--mirror", "http://u:pw1@h:4222"}, 2, "scheme"},
		{[]string{"--mirror", "nats-leaf://u:pw1@h:99999"}, 2, "port"},
		{[]string{"--mirror", "nats-leaf://127.0.0.1:7422,nats-leaf://u:pw1@:7422"}, 2, "--mirror"},
		{[]string{"--mirror", "nats-leaf://127.0.0.1:7422", "--mirror-host", "Host_A"}, 2, "--mirror-host"},
		{[]string{"--mirror", "nats-leaf://127.0.0.1:7422", "--mirror-replicas", "9"}, 2, "--mirror-replicas"},
		{[]string{"--mirror", "nats-leaf://u:pw1@127.0.0.1:7422", "--mirror-creds", root + "/no.creds"}, 1, "no.creds"},
	} {
		r := nexus(t, root, append([]string{"daemon"}, c.args...)...)
		wantFailure(t, r, c.code, c.mention)
		if strings.Contains(r.stderr, "pw1") {
			t.Fatalf("%v: the error shows the password: %q", c.args, r.stderr)
		}
	}
}

func TestFleetTemplateAndStatusErrors(t *testing.T) {
	root := t.TempDir()
	r := nexus(t, root, "fleet", "template", "--host", "host-a,host-b", "--host", "host-c")
	if r.code != 0 {
		t.Fatalf("template: exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"NEXUS_HOST_A: {", "NEXUS_HOST_C: {", "$NEXUS_HOST_B_PASSWORD", "NEXUS_AUDIT: {", `"LEAFNODE"`, "STREAM.DELETE"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("template lacks %q:\n%s", want, r.stdout)
		}
	}
	wantFailure(t, nexus(t, root, "fleet", "template"), 2, "host")
	wantFailure(t, nexus(t, root, "fleet", "template", "--host", "Host_A"), 2, "Host_A")
	wantFailure(t, nexus(t, root, "fleet", "template", "--host", "a,a"), 2, "twice")
	wantFailure(t, nexus(t, root, "fleet", "status"), 1, "no daemon")
}
