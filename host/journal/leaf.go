package journal

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// LeafMirror replicates the journal elsewhere through a leaf-node link of
// the embedded server (the fleet's mirror). The journal only makes the
// link, refuses every write that could come back over it, and tells the
// mirror when the stream exists; what is mirrored where is the mirror's.
type LeafMirror interface {
	// Leaf is the link the embedded server dials; an error fails Open
	// before the server starts.
	Leaf() (Leaf, error)
	// Start runs once the journal's stream exists, with what the mirror
	// may use; an error fails Open. What it starts runs until Stop.
	Start(ctx context.Context, l Linked) error
	// Stop ends what Start started; Close calls it (also after a failed
	// Open) before the server stops.
	Stop()
}

// Leaf is the embedded server's side of a leaf-node link.
type Leaf struct {
	// ServerName names the embedded server (distinct per host: a hub
	// takes two links with one server name for one server reconnecting).
	ServerName string
	// Domain is the embedded JetStream's domain, the one the other side
	// addresses this journal's stream in.
	Domain string
	// URLs are the other side's leaf-node endpoints, tried in turn.
	URLs []*url.URL
	// Credentials is a NATS .creds file for the link, or "".
	Credentials string
}

// Linked is what a LeafMirror is given once the journal's stream exists.
type Linked struct {
	// Journal is the open journal (its stream exists).
	Journal *Journal
	// Conn is an in-process connection as nexus itself, through which the
	// other side's JetStream is reached over the link.
	Conn *nats.Conn
	// Up says whether the leaf link is up now.
	Up func() bool
	// Peers are the nodes the link is up to now, as the embedded server
	// sees them (none while it is down).
	Peers func() []LeafPeer
	// Refused gets the other side's refusal of the link's credentials,
	// which the server only logs.
	Refused <-chan string
	// Log is Options.Logger (discarding if nil).
	Log *slog.Logger
}

// LeafPeer is a node at the other end of an up leaf-node link.
type LeafPeer struct {
	// Name is the node's server name, Addr the address it was reached at.
	Name string `json:"name"`
	Addr string `json:"addr"`
	// RTT is the link's last measured round trip ("" before the first).
	RTT string `json:"rtt,omitempty"`
}

// leafPeers lists the nodes srv's leaf links are up to.
func leafPeers(srv *server.Server) []LeafPeer {
	lz, err := srv.Leafz(nil)
	if err != nil || lz == nil {
		return nil
	}
	out := make([]LeafPeer, 0, len(lz.Leafs))
	for _, l := range lz.Leafs {
		out = append(out, LeafPeer{Name: l.Name, Addr: net.JoinHostPort(l.IP, strconv.Itoa(l.Port)), RTT: l.RTT})
	}
	return out
}

// leafRemote is the embedded server's side of the link: everything the
// other side could send that would change the journal is denied.
func leafRemote(l Leaf) *server.RemoteLeafOpts {
	return &server.RemoteLeafOpts{
		URLs:        l.URLs,
		Credentials: l.Credentials,
		DenyImports: deniedFromLeaf(l.Domain),
	}
}

// deniedFromLeaf is every subject the other side of the link may not send
// into this server: appends to the journal, and each JetStream API call
// that writes or deletes. Reads and the consumers a mirror needs stay
// open; the other side can see the journal, never change it.
func deniedFromLeaf(domain string) []string {
	deny := []string{Subjects, appendSubjects, "$SYS.>", "$JS.API.>"}
	for _, api := range []string{
		"STREAM.CREATE.>", "STREAM.UPDATE.>", "STREAM.DELETE.>", "STREAM.PURGE.>",
		"STREAM.MSG.DELETE.>", "STREAM.SNAPSHOT.>", "STREAM.RESTORE.>", "STREAM.PEER.>",
		"STREAM.LEADER.>", "CONSUMER.DELETE.>", "CONSUMER.PAUSE.>", "CONSUMER.UNPIN.>",
		"ACCOUNT.>", "META.>", "SERVER.>",
	} {
		deny = append(deny, "$JS."+domain+".API."+api)
	}
	return deny
}
