//go:build nexusd

package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/host/fleet"
)

// fleetTemplate prints the fleet's accounts and permissions for hosts.
func fleetTemplate(cmd *cobra.Command, hosts []string, tf templateFlags, domain, maxBytes string) error {
	t := fleet.Template{Auditor: tf.auditor, Aggregator: tf.aggregator, Operator: tf.operator, MaxStreams: tf.maxStreams}
	for _, h := range hosts {
		t.Hosts = append(t.Hosts, strings.Split(h, ",")...)
	}
	n, err := parseBytes(maxBytes)
	if err != nil {
		return usageError{fmt.Errorf("--max-bytes %q: %w", maxBytes, err)}
	}
	t.MaxBytes = n
	conf, err := t.Config(domain)
	if err != nil {
		return usageError{err}
	}
	_, err = fmt.Fprint(cmd.OutOrStdout(), conf)
	return err
}
