package fleetstate

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
)

// Settings are what a daemon mirrors with, as its flags, NEXUS_MIRROR and
// the config file's [fleet] section give them: decided by a command about
// to start a daemon as well as by the daemon, neither of which needs the
// fleet's adapter for it.
type Settings struct {
	// URLs are the fleet's leaf-node endpoints (nats-leaf://, nats:// or
	// tls://), with user:password in them if the fleet wants them.
	URLs []*url.URL
	// Credentials is a NATS .creds file for the link, or "".
	Credentials string
	// Domain is the fleet's JetStream domain, where the mirror stream is made.
	Domain string
	// Host names this host in the fleet (ValidHostName).
	Host string
	// Replicas of the mirror when nexus creates it; 0 asks for 3 and takes
	// 1 when the fleet cannot place 3.
	Replicas int
	// MaxBytes limits the mirror when nexus creates it; 0 is no limit.
	MaxBytes int64
}

// Fingerprint names the settings: the URLs (with their passwords), the
// credentials file and its content (creds, read by the caller), domain,
// host name, replicas and byte limit. Two mirrors with one fingerprint
// link and mirror alike; a daemon whose fingerprint is not the one its
// configuration gives runs stale settings. It is a digest, so it repeats
// no password. Nil settings (no mirroring) have the empty one.
func (s *Settings) Fingerprint(creds []byte) string {
	if s == nil {
		return ""
	}
	h := sha256.New()
	for _, u := range s.URLs {
		fmt.Fprintf(h, "url %q\n", u.String())
	}
	fmt.Fprintf(h, "creds %q\n", s.Credentials)
	if s.Credentials != "" && creds != nil {
		// A rotated credentials file is a new setting: a daemon still
		// linked with the old one is stale.
		fmt.Fprintf(h, "creds-content %x\n", sha256.Sum256(creds))
	}
	fmt.Fprintf(h, "domain %q\nhost %q\nreplicas %d\nmax-bytes %d\n", s.Domain, s.Host, s.Replicas, s.MaxBytes)
	return hex.EncodeToString(h.Sum(nil)[:12])
}

var hostName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`) })

// ValidHostName checks a fleet host name: 1-63 of a-z, 0-9 and '-', not
// starting or ending with '-'. Upper case and '_' are refused rather than
// folded, so two names an operator typed differently never name one stream
// (the stream name upper-cases and turns '-' into '_').
func ValidHostName(name string) error {
	if !hostName().MatchString(name) {
		return fmt.Errorf("host name %q: want 1-63 of a-z, 0-9 and '-', not starting or ending with '-'", name)
	}
	return nil
}

// HostNameFrom turns an OS hostname into a valid host name: the first
// label, lower-cased, every other character '-'. Distinct hostnames may
// fold into one name; the identity check on the fleet catches that.
func HostNameFrom(hostname string) string {
	h, _, _ := strings.Cut(hostname, ".")
	h = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, h)
	if len(h) > 63 {
		h = h[:63]
	}
	if h = strings.Trim(h, "-"); h == "" {
		return "host"
	}
	return h
}

// CheckURL refuses what the link could never dial, naming the URL
// without its password.
func CheckURL(u *url.URL) error {
	if u == nil || u.Hostname() == "" {
		return errors.New("fleet: mirror URL needs a host")
	}
	switch u.Scheme {
	case "nats-leaf", "nats", "tls":
	default:
		return fmt.Errorf("fleet: mirror URL %s: scheme %q: want nats-leaf, nats or tls", u.Redacted(), u.Scheme)
	}
	if p := u.Port(); p != "" {
		var n int
		if _, err := fmt.Sscanf(p, "%d", &n); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("fleet: mirror URL %s: bad port", u.Redacted())
		}
	}
	return nil
}

// ParseURL parses one fleet URL; its errors never repeat a password.
func ParseURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("mirror URL %s: want nats-leaf://[user:pass@]HOST:PORT", RedactURL(s))
	}
	if err := CheckURL(u); err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "fleet: "))
	}
	return u, nil
}

// RedactURL hides the user information of a URL that may not parse.
func RedactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		rest, scheme = s, ""
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = "xxxxx@" + rest[i+1:]
	}
	if scheme != "" {
		return scheme + "://" + rest
	}
	return rest
}
