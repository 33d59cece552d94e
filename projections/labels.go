package projections

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"unicode"

	"github.com/nexus-sandbox/nexus/events"
)

// Bounds of a label set: enough for an operator's tags, small enough that
// an event carrying them stays small.
const (
	MaxLabels     = 64
	MaxLabelKey   = 128
	MaxLabelValue = 256
)

// labelKeyRE is what a label key may be: a letter or digit, then letters,
// digits, '.', '_', '-' and '/' (docker's and Kubernetes' keys fit).
var labelKeyRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`) })

// ParseLabel reads one KEY=VALUE label. The value may be empty and may
// hold '=' (the key ends at the first); it holds no control character.
func ParseLabel(s string) (key, value string, err error) {
	key, value, ok := strings.Cut(s, "=")
	switch {
	case !ok:
		return "", "", fmt.Errorf("label %q: want KEY=VALUE", s)
	case len(key) > MaxLabelKey || !labelKeyRE().MatchString(key):
		return "", "", fmt.Errorf("label %q: the key is a letter or digit, then letters, digits, '.', '_', '-', '/' (at most %d)", s, MaxLabelKey)
	case len(value) > MaxLabelValue:
		return "", "", fmt.Errorf("label %q: the value is longer than %d bytes", s, MaxLabelValue)
	case strings.ContainsFunc(value, unicode.IsControl):
		return "", "", fmt.Errorf("label %q: the value holds a control character", s)
	}
	return key, value, nil
}

// ParseLabels reads --label KEY=VALUE flags into the labels an event
// records (nil for none). A key given twice is refused, not overwritten.
func ParseLabels(flags []string) (events.Labels, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	if len(flags) > MaxLabels {
		return nil, fmt.Errorf("label given %d times: at most %d labels", len(flags), MaxLabels)
	}
	out := events.Labels{}
	for _, f := range flags {
		k, v, err := ParseLabel(f)
		if err != nil {
			return nil, err
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("label %q given twice", k)
		}
		out[k] = v
	}
	return out, nil
}
