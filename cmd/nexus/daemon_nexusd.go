//go:build nexusd

package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/host/fleet"
)

// runDaemon serves the root until the daemon is stopped.
func runDaemon(cmd *cobra.Command, g *globals, f *daemonFlags) error {
	o := daemon.Options{Listen: f.listen, AllowRemote: f.allowRemote, Idle: f.idle, Auto: f.auto}
	tlsOpts := daemon.TLS{CertFile: f.tlsCert, KeyFile: f.tlsKey, ClientCA: f.tlsClientCA}
	m := &fleet.Mirror{Domain: f.mirrorDomain, Host: f.mirrorHost, Credentials: f.mirrorCreds, Replicas: f.mirrorReplicas}
	mirrorURLs, mirrorBytes := f.mirrorURLs, f.mirrorBytes
	// NEXUS_MIRROR keeps a fleet password out of /proc/<pid>/cmdline.
	passOnCmdline := strings.Contains(strings.Join(mirrorURLs, ","), "@")
	if len(mirrorURLs) == 0 && os.Getenv("NEXUS_MIRROR") != "" {
		mirrorURLs = []string{os.Getenv("NEXUS_MIRROR")}
	}
	if len(mirrorURLs) == 0 {
		var err error
		if mirrorURLs, err = fleetFromConfig(cmd, g, m, &mirrorBytes); err != nil {
			return err
		}
	}
	if len(mirrorURLs) > 0 {
		if err := mirrorFlags(m, mirrorURLs, mirrorBytes); err != nil {
			return usageError{err}
		}
		o.Mirror = m
	}
	o.LockWait = lockWait
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
	return daemon.Run(cmd.Context(), g.stateDir, o)
}

// fleetFromConfig is the config file's [fleet] section for a daemon given
// no fleet URL: its URLs, and each setting its flag does not set.
func fleetFromConfig(cmd *cobra.Command, g *globals, m *fleet.Mirror, maxBytes *string) ([]string, error) {
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
		if !cmd.Flags().Changed(flag) {
			set()
		}
	}
	return f.URLs, nil
}

// mirrorFlags fills m from the daemon's --mirror flags. Its errors never
// repeat a password.
func mirrorFlags(m *fleet.Mirror, urls []string, maxBytes string) error {
	for _, arg := range urls {
		for _, s := range strings.Split(arg, ",") {
			u, err := fleet.ParseFleetURL(strings.TrimSpace(s))
			if err != nil {
				return fmt.Errorf("--mirror: %w", err)
			}
			m.URLs = append(m.URLs, u)
		}
	}
	if m.Host == "" {
		h, _ := os.Hostname()
		m.Host = fleet.HostNameFrom(h)
	} else if err := fleet.ValidHostName(m.Host); err != nil {
		return fmt.Errorf("--mirror-host: %w", err)
	}
	if m.Replicas < 0 || m.Replicas > 5 {
		return fmt.Errorf("--mirror-replicas %d: want 1 to 5", m.Replicas)
	}
	n, err := parseBytes(maxBytes)
	if err != nil {
		return fmt.Errorf("--mirror-max-bytes %q: %w", maxBytes, err)
	}
	m.MaxBytes = n
	return nil
}
