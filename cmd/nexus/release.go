//go:build !nexustest

package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/session"
)

// A release build has no failure injection and no test-only commands; see
// testhooks.go, which a build with -tags nexustest uses instead.

func testHooks() session.Hook { return nil }

func watchInterrupt(context.Context) {}

func spawnLockHook() func() { return nil }

func ensuredHook() func() { return nil }

func earlyOpenHook() func() { return nil }

func failAppends(b control.Backend) control.Backend { return b }

func testCommands(*globals) []*cobra.Command { return nil }
