package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/dustin/go-humanize/english"
	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/session"
)

// imageCacheCmd is `nexus image-cache list|prune`: prepared image disks
// under images/, protected by journal references and the cache lease.
func imageCacheCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "image-cache", Short: "List and prune prepared image disks (images/)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{fmt.Errorf("image-cache: want a subcommand: list or prune")}
		}}
	var listOut *output
	list := &cobra.Command{Use: "list", Short: "List cache entries: id, image, allocated and apparent size, last use, layout, sandboxes", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				rows, _, err := m.ImageCacheList(cmd.Context())
				if err != nil {
					return err
				}
				return printList(cmd, listOut, rows, func(r session.CacheListing) string { return r.CacheID }, cacheTable)
			})
		}}
	listOut = addOutput(list, true)

	var unused, dryRun bool
	var pruneOut *output
	var olderThan, maxBytes string
	prune := &cobra.Command{Use: "prune --unused [--dry-run] [--older-than DUR] [--max-bytes N]",
		Short: "Remove committed entries no persisted sandbox references", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := pruneOptions(unused, dryRun, olderThan, maxBytes)
			if err != nil {
				return usageError{err}
			}
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				rep, err := m.PruneImageCache(cmd.Context(), opts)
				if err != nil {
					return err
				}
				ids := func() []string {
					var out []string
					for _, r := range rep.Removed {
						out = append(out, r.CacheID)
					}
					return out
				}
				return printValue(cmd, pruneOut, rep, ids, func(w io.Writer) {
					verb := "removed"
					if rep.DryRun {
						verb = "would remove"
					}
					for _, r := range rep.Removed {
						fmt.Fprintf(w, "%s\t%s\t%s\n", verb, r.CacheID, formatSize(r.Allocated))
					}
					fmt.Fprintf(w, "%s %s, %s allocated\n", verb, english.Plural(len(rep.Removed), "entry", "entries"), formatSize(rep.AllocatedBytes))
				})
			})
		}}
	prune.Flags().BoolVar(&unused, "unused", false, "remove entries no persisted sandbox references (required)")
	prune.Flags().BoolVar(&dryRun, "dry-run", false, "report what would be removed; take no lease, change nothing")
	prune.Flags().StringVar(&olderThan, "older-than", "", "only entries last used longer ago than DUR (e.g. 36h, 7d)")
	prune.Flags().StringVar(&maxBytes, "max-bytes", "", "evict least recently used unreferenced entries until the cache's allocated bytes fit in N (e.g. 0, 512M, 20G)")
	pruneOut = addOutput(prune, true)
	c.AddCommand(list, prune)
	return c
}

var cacheTable = table[session.CacheListing]{
	header: []string{"CACHE ID", "IMAGE", "ALLOCATED", "APPARENT", "LAST USED", "LAYOUT", "SANDBOXES"},
	row: func(r session.CacheListing) []string {
		last, layout := "", ""
		if r.LastUsedAt != nil {
			last = age(*r.LastUsedAt)
		}
		if r.Layout != nil {
			layout = strconv.Itoa(*r.Layout)
		}
		return []string{r.CacheID, deref(r.Ref), formatSize(r.Allocated), formatSize(r.Apparent), last, layout, strconv.Itoa(len(r.Sandboxes))}
	},
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func pruneOptions(unused, dryRun bool, olderThan, maxBytes string) (session.CachePruneOptions, error) {
	opts := session.CachePruneOptions{DryRun: dryRun, MaxBytes: -1}
	if !unused {
		return opts, fmt.Errorf("prune needs --unused (the only selection it supports: entries no sandbox references)")
	}
	if olderThan != "" {
		d, err := parseAge(olderThan)
		if err != nil {
			return opts, fmt.Errorf("--older-than %q: %v", olderThan, err)
		}
		opts.OlderThan = d
	}
	if maxBytes != "" {
		n, err := config.ParseBytes(maxBytes)
		if err != nil {
			return opts, fmt.Errorf("--max-bytes %q: %v", maxBytes, err)
		}
		opts.MaxBytes = n
	}
	return opts, nil
}
