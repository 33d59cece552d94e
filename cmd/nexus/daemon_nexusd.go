//go:build nexusd

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/host/fleet"
)

// runDaemon serves the root until the daemon is stopped.
func runDaemon(cmd *cobra.Command, g *globals, f *daemonFlags) error {
	o := daemon.Options{Listen: f.listen, MetricsListen: f.metricsListen, AllowRemote: f.allowRemote, Idle: f.idle, Auto: f.auto}
	tlsOpts := daemon.TLS{CertFile: f.tlsCert, KeyFile: f.tlsKey, ClientCA: f.tlsClientCA}
	// NEXUS_MIRROR keeps a fleet password out of /proc/<pid>/cmdline.
	passOnCmdline := strings.Contains(strings.Join(f.mirrorURLs, ","), "@")
	settings := f.mirror
	m, err := daemonMirror(g, f.mirrorURLs, &settings, f.mirrorBytes, cmd.Flags().Changed)
	if err != nil {
		return err
	}
	if m != nil {
		o.Mirror = fleet.FromSettings(*m)
	}
	o.LockWait = lockWait
	if s := os.Getenv("NEXUS_FLEET_DIGEST_INTERVAL"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return usageError{fmt.Errorf("NEXUS_FLEET_DIGEST_INTERVAL=%q: want a positive duration such as 1m", s)}
		}
		o.DigestInterval = d
	}
	switch {
	case tlsOpts != (daemon.TLS{}) && (tlsOpts.CertFile == "" || tlsOpts.KeyFile == ""):
		return usageError{errors.New("--tls-cert and --tls-key go together")}
	case tlsOpts != (daemon.TLS{}) && o.Listen == "":
		return usageError{errors.New("--tls-cert needs --listen")}
	case tlsOpts != (daemon.TLS{}):
		o.TLS = &tlsOpts
	}
	if o.Auto && !cmd.Flags().Changed("idle") {
		d, err := idleFromEnv()
		if err != nil {
			return usageError{err}
		}
		o.Idle = d
	}
	build, err := managerFor(g)
	if err != nil {
		return err
	}
	log, err := daemonLogger(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	o.Logger = log
	if passOnCmdline {
		log.Warn("the fleet credentials are on the command line, readable in /proc/<pid>/cmdline: pass the URL in NEXUS_MIRROR or use --mirror-creds")
	}
	o.Manager = build
	o.BeforeJournal = earlyOpenHook()
	return daemon.Run(cmd.Context(), g.stateDir, o)
}
