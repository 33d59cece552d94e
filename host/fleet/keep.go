package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/host/fleetstate"
)

// DialAggregator connects as the aggregator for a long run
// (KeepAggregate): unlike Dial's reads, it redials for as long as the
// fleet is away instead of giving up after a few tries.
func DialAggregator(natsURL, credsFile string) (*Auditor, error) {
	return dial(natsURL, credsFile, nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
}

// KeepInterval and KeepResumeEvery are KeepAggregate's pace by default:
// how often it looks at the sources, and how often it sets their resume
// points.
const (
	KeepInterval    = time.Second
	KeepResumeEvery = time.Minute
)

// silentAfter is how long a source may go without hearing from its
// mirror before it counts as silent: a live source hears its consumer's
// heartbeat every second.
const silentAfter = 3 * time.Second

// sourceView is one pass's view of one of the aggregate's sources.
type sourceView struct {
	host string
	// silent: the source heard nothing from its mirror for silentAfter
	// or never did since its leader set it up.
	silent bool
	// held is the mirror sequence of the last record the aggregate
	// holds from it.
	held uint64
	// mirror is the mirror's last sequence; 0 when unknown (the mirror
	// could not be asked).
	mirror uint64
}

// stalled are the hosts whose source is silent, behind its mirror, and
// holds no more than it did at the pass before (prev, by host): a source
// nats-server is waiting to set up again. A source that moved, hears
// its mirror, or whose mirror could not be asked is left to the server.
func stalled(prev map[string]uint64, cur []sourceView) []string {
	var hosts []string
	for _, s := range cur {
		before, seen := prev[s.host]
		if s.silent && s.mirror > s.held && seen && s.held <= before {
			hosts = append(hosts, s.host)
		}
	}
	slices.Sort(hosts)
	return hosts
}

// KeepAggregate keeps the aggregate current until ctx ends. Once it has
// run EnsureAggregate (again every resumeEvery, which keeps the
// sources' resume points), it looks at the sources every interval, and
// when some are stalled (stalled) it has the aggregate's leader step
// down: the new leader sets every source up again at once from what the
// aggregate holds. Left alone, nats-server waits 30 s for the answer to
// a source's setup request (a fleet coming back from an outage loses
// such requests), then retries after 5 s times twice its failures, up
// to 2 minutes, and the aggregate trails its mirrors by that much. Step-downs are
// spaced: after one, the next waits at least 4 intervals, doubling while
// the same sources stay stalled, up to 2 minutes. A one-replica
// aggregate has no leader to step down; its stalls are reported and
// left to the server. Each step-down and each failed pass is reported.
func (f *Auditor) KeepAggregate(ctx context.Context, hosts []string, replicas int, interval, resumeEvery time.Duration, report func(string)) error {
	if interval <= 0 || resumeEvery <= 0 {
		return fmt.Errorf("fleet: keep the aggregate: intervals must be positive")
	}
	var ensured time.Time
	prev := map[string]uint64{}
	var calm time.Time // no step-down before
	spacing := 4 * interval
	for {
		if time.Since(ensured) >= resumeEvery {
			if added, err := f.EnsureAggregate(ctx, hosts, replicas); ctx.Err() != nil {
				return nil
			} else if err != nil {
				report(err.Error())
			} else {
				ensured = time.Now()
				if len(added) > 0 {
					report(fmt.Sprintf("added %s to %s", fmt.Sprint(added), AggregateStream))
				}
			}
		}
		views, r, err := f.sourceViews(ctx, interval)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			report(err.Error())
		default:
			stuck := stalled(prev, views)
			prev = map[string]uint64{}
			for _, v := range views {
				prev[v.host] = v.held
			}
			if len(stuck) == 0 {
				spacing = 4 * interval
				break
			}
			if time.Now().Before(calm) {
				break
			}
			if r < 2 {
				report(fmt.Sprintf("sources of %s stalled (%v): one replica, no leader to step down; left to the server's retries", AggregateStream, stuck))
				calm = time.Now().Add(spacing)
				spacing = min(2*spacing, 2*time.Minute)
				break
			}
			if err := f.stepDown(ctx); err != nil {
				report(fmt.Sprintf("sources of %s stalled (%v): step down its leader: %v", AggregateStream, stuck, err))
			} else {
				report(fmt.Sprintf("sources of %s stalled (%v): its leader stepped down, the next sets them up again", AggregateStream, stuck))
			}
			calm = time.Now().Add(spacing)
			spacing = min(2*spacing, 2*time.Minute)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// sourceViews reads the aggregate's sources and, for each silent one,
// its mirror's last sequence; it returns the aggregate's replicas too.
func (f *Auditor) sourceViews(ctx context.Context, interval time.Duration) ([]sourceView, int, error) {
	rctx, cancel := context.WithTimeout(ctx, passTimeout(interval))
	defer cancel()
	s, err := f.js.Stream(rctx, AggregateStream)
	if err != nil {
		return nil, 0, f.NoAggregate(err)
	}
	info := s.CachedInfo()
	var mirrors jetstream.JetStream
	var views []sourceView
	for _, src := range info.Sources {
		v := sourceView{host: hostOfStream(src.Name), held: src.Seq, silent: src.Active < 0 || src.Active > silentAfter}
		if v.silent {
			if mirrors == nil {
				if mirrors, err = jetstream.NewWithAPIPrefix(f.nc, AuditAPIPrefix); err != nil {
					return nil, 0, err
				}
			}
			if m, err := mirrors.Stream(rctx, src.Name); err == nil {
				v.mirror = m.CachedInfo().State.LastSeq
			}
		}
		views = append(views, v)
	}
	return views, info.Config.Replicas, nil
}

// passTimeout bounds a pass's requests: a pass that waits on a fleet
// still coming back must not hold up the next one by much.
func passTimeout(interval time.Duration) time.Duration { return max(2*interval, 2*time.Second) }

// stepDown asks the aggregate's leader to step down.
func (f *Auditor) stepDown(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	msg, err := f.nc.RequestWithContext(rctx, stepDownSubject, nil)
	if err != nil {
		return err
	}
	var resp struct {
		Success bool                `json:"success"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("answer %q: %w", msg.Data, err)
	}
	if resp.Error != nil {
		return resp.Error
	}
	if !resp.Success {
		return errors.New("refused")
	}
	return nil
}

// stepDownSubject is the request that has the aggregate's leader step
// down; of the fleet's users only the aggregator (and the operator) may
// send it.
const stepDownSubject = "$JS.API.STREAM.LEADER.STEPDOWN." + fleetstate.AggregateStream
