package supervisor

import "github.com/nexus-sandbox/nexus/host/proc"

// The command (of nexus-shim, and of nexusd) that runs a supervisor, and
// its flags.
const (
	Command       = "supervisor"
	SandboxFlag   = "sandbox"
	StateDirFlag  = "state-dir"
	IIDSocketFlag = "iid-socket"
	// ConsoleLogFlag and ConsoleIndexFlag name the console log the
	// supervisor keeps the time index of, and the index.
	ConsoleLogFlag   = "console-log"
	ConsoleIndexFlag = "console-index"
)

// Argv is the command line that runs o's supervisor from exe, nexus-shim.
func Argv(exe string, o ServeOptions) []string {
	argv := append(append([]string{exe}, naming(o.SandboxID, o.StateDir)...), "--"+IIDSocketFlag, o.IIDSocket)
	if o.ConsoleLog != "" && o.ConsoleIndex != "" {
		argv = append(argv, "--"+ConsoleLogFlag, o.ConsoleLog, "--"+ConsoleIndexFlag, o.ConsoleIndex)
	}
	return argv
}

// naming is the part of Argv after the binary that names one supervisor.
func naming(sandbox, stateDir string) []string {
	return []string{Command, "--" + SandboxFlag, sandbox, "--" + StateDirFlag, stateDir}
}

// Processes lists the processes Argv started for sandbox's supervisor in
// stateDir, by their command lines (one scan of /proc): how a supervisor
// spawned just before its spawner died is found before it answers.
func Processes(sandbox, stateDir string) []int {
	return proc.WithArgs(naming(sandbox, stateDir)...)
}
