package main

import (
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/config"
)

// driverName is the driver a new sandbox is made with: --driver, else
// NEXUS_DRIVER (both in g.driver), else [vm] driver, else the default.
func driverName(g *globals, cfg config.File) string { return cfg.DriverName(g.driver) }

// configReaders are the commands that read a config setting (both size
// and warn ratio apply to new overlays and to start's overlay check; the
// boot assets to every cold boot, a fork of a stopped parent's too). Only
// they are refused by a broken config file: a typo in a setting for new
// sandboxes must not stop stop, rm, recover or ls.
var configReaders = map[string]bool{"create": true, "start": true, "fork": true, "restore": true}

func loadConfig(root string) (config.File, error) {
	c, _, err := config.Load(root)
	return c, err
}

func configCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "Show nexus's effective settings"}
	var o *output
	show := &cobra.Command{
		Use:   "show",
		Short: "Print every effective setting and where it came from (flag, environment, config file or default)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			root, err := filepath.Abs(g.stateDir)
			if err != nil {
				return err
			}
			asked := config.Asked{StateDirFlag: cmd.Flags().Changed("state-dir"), DaemonIdle: defaultIdle.String()}
			if cmd.Flags().Changed("driver") {
				asked.DriverFlag = &g.driver
			}
			list, err := config.Settings(root, asked)
			if err != nil {
				return err
			}
			return printList(cmd, o, list, func(s config.Setting) string { return s.Name }, table[config.Setting]{
				header: []string{"SETTING", "VALUE", "SOURCE"},
				row:    func(s config.Setting) []string { return []string{s.Name, s.Value, s.Source} },
			})
		},
	}
	o = addOutput(show, true)
	c.AddCommand(show)
	return c
}
