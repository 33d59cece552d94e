package ledger

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/layout"
)

func good() Record {
	return Record{Schema: 1, Run: "01JRUN", Pid: 42, StartTimeMs: 1_700_000_000_000, Driver: "process", Nexus: "/usr/bin/nexus"}
}

func TestRecordRoundTrip(t *testing.T) {
	b, err := good().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRecord(b, "01JRUN")
	if err != nil || r != good() {
		t.Fatalf("round trip: %+v %v", r, err)
	}
}

func TestParseRecordStrict(t *testing.T) {
	full := `"schema":1,"run":"01JRUN","pid":42,"start_time_ms":1700000000000,"driver":"process","nexus":""`
	cases := map[string]struct {
		doc  string
		want error
	}{
		"ok":              {`{` + full + `}`, nil},
		"empty":           {``, ErrMalformed},
		"torn":            {`{"schema":1,"run":"01J`, ErrMalformed},
		"not object":      {`[1]`, ErrMalformed},
		"no schema":       {`{"run":"01JRUN"}`, ErrMalformed},
		"newer schema":    {`{"schema":2,"anything":true}`, ErrSchemaTooNew},
		"older schema":    {`{` + strings.Replace(full, `"schema":1`, `"schema":0`, 1) + `}`, ErrMalformed},
		"unknown field":   {`{` + full + `,"extra":1}`, ErrMalformed},
		"missing nexus":   {`{` + strings.Replace(full, `,"nexus":""`, ``, 1) + `}`, ErrMalformed},
		"trailing":        {`{` + full + `}{}`, ErrMalformed},
		"other run":       {`{` + strings.Replace(full, `01JRUN`, `01JOTHER`, 1) + `}`, ErrMalformed},
		"zero pid":        {`{` + strings.Replace(full, `"pid":42`, `"pid":0`, 1) + `}`, ErrMalformed},
		"string pid":      {`{` + strings.Replace(full, `"pid":42`, `"pid":"42"`, 1) + `}`, ErrMalformed},
		"no start":        {`{` + strings.Replace(full, `1700000000000`, `0`, 1) + `}`, ErrMalformed},
		"empty driver":    {`{` + strings.Replace(full, `"process"`, `""`, 1) + `}`, ErrMalformed},
		"relative nexus":  {`{` + strings.Replace(full, `"nexus":""`, `"nexus":"bin/nexus"`, 1) + `}`, ErrMalformed},
		"run with slash":  {strings.Replace(`{`+full+`}`, `01JRUN`, `a/b`, 1), ErrMalformed},
		"case-folded key": {`{` + full + `,"PID":7}`, ErrMalformed},
		"trailing spaces": {`{` + full + "}\n\n ", nil},
	}
	for name, c := range cases {
		_, err := ParseRecord([]byte(c.doc), "01JRUN")
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", name, err, c.want)
		}
	}
}

func TestParseNames(t *testing.T) {
	cases := []struct {
		in   string
		want []string
		bad  bool
	}{
		{"", nil, false},
		{"a\n", []string{"a"}, false},
		{"a\nb\na\n", []string{"a", "b"}, false},
		{"a\nb", []string{"a", "b"}, false}, // torn last line still counts
		{"a\n\nb\n", []string{"a", "b"}, true},
		{"a\n../x\nb\n", []string{"a", "b"}, true},
		{"a b\n01M8XY4P0P9XSGQATBNB05BKX3\n", []string{"01M8XY4P0P9XSGQATBNB05BKX3"}, true},
		{"a\r\n", nil, true},
	}
	for _, c := range cases {
		got, err := ParseNames([]byte(c.in))
		if fmt.Sprint(got) != fmt.Sprint(c.want) || (err != nil) != c.bad {
			t.Errorf("ParseNames(%q) = %v, %v; want %v, bad=%v", c.in, got, err, c.want, c.bad)
		}
		if err == nil {
			again, _ := ParseNames(RenderNames(got))
			if fmt.Sprint(again) != fmt.Sprint(got) {
				t.Errorf("render/parse %q: %v", c.in, again)
			}
		}
	}
}

// TestDecideExhaustive walks every combination of the inputs the rule looks
// at and checks each against the rule written out independently.
func TestDecideExhaustive(t *testing.T) {
	self := Self{Run: "SELF", Driver: "process"}
	rec := good()
	parseErrs := []error{nil, ErrMalformed, fmt.Errorf("wrap: %w", ErrSchemaTooNew)}
	ages := []time.Duration{0, UnparseableGrace - time.Second, UnparseableGrace, 3 * UnparseableGrace}
	runs := []string{"SELF", rec.Run}
	drivers := []string{"process", "cloud-hypervisor"}
	owners := []Owner{
		{Running: false},
		{Running: true, StartTimeMs: rec.StartTimeMs},
		{Running: true, StartTimeMs: rec.StartTimeMs + 2000},
		{Running: true, StartTimeMs: rec.StartTimeMs - 2000},
		{Running: true, StartTimeMs: rec.StartTimeMs + 2001},
		{Running: true, StartTimeMs: rec.StartTimeMs - 60_000},
	}
	n := 0
	for _, run := range runs {
		for _, pe := range parseErrs {
			for _, age := range ages {
				for _, drv := range drivers {
					for _, ow := range owners {
						for _, locked := range []bool{false, true} {
							n++
							r := rec
							r.Driver = drv
							o := Observation{Run: run, Record: r, ParseErr: pe, Age: age, Owner: ow, Locked: locked}
							got := Decide(o, self)
							want := spec(o, self)
							if got != want {
								t.Errorf("%+v: got %+v, want %+v", o, got, want)
							}
							if NeedsOwner(o, self) != (run != "SELF" && !locked && pe == nil && drv == "process") {
								t.Errorf("NeedsOwner(%+v) wrong", o)
							}
						}
					}
				}
			}
		}
	}
	if n != 2*3*4*2*6*2 {
		t.Fatalf("walked %d cases", n)
	}
}

// spec is the seed's table, written as plainly as possible.
func spec(o Observation, self Self) Decision {
	if o.Run == self.Run {
		return Decision{Keep, ReasonSelf}
	}
	// A lock on the record is held by a live process: its writer.
	if o.Locked {
		return Decision{Keep, ReasonOwnerLocked}
	}
	if o.ParseErr != nil {
		if errors.Is(o.ParseErr, ErrSchemaTooNew) {
			return Decision{Keep, ReasonSchemaTooNew}
		}
		if o.Age < time.Hour {
			return Decision{Keep, ReasonUnparseableYoung}
		}
		return Decision{Sweep, ReasonUnparseableOld}
	}
	if o.Record.Driver != self.Driver {
		return Decision{Keep, ReasonOtherDriver}
	}
	if !o.Owner.Running {
		return Decision{Sweep, ReasonOwnerGone}
	}
	diff := o.Owner.StartTimeMs - o.Record.StartTimeMs
	if diff >= -2000 && diff <= 2000 {
		return Decision{Keep, ReasonOwnerAlive}
	}
	return Decision{Sweep, ReasonPidReused}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": ModeOn, "on": ModeOn, "sweep": ModeSweep, "off": ModeOff, "OFF": ModeOn, "no": ModeOn, " off": ModeOn} {
		if got := ParseMode(in); got != want {
			t.Errorf("ParseMode(%q) = %q, want %q", in, got, want)
		}
	}
	if !ModeOn.Sweeps() || !ModeOn.Watches() || !ModeSweep.Sweeps() || ModeSweep.Watches() || ModeOff.Sweeps() || ModeOff.Watches() {
		t.Fatal("mode table")
	}
}

func FuzzParseRecord(f *testing.F) {
	b, _ := good().Marshal()
	f.Add(b)
	f.Add([]byte(`{"schema":2}`))
	f.Add([]byte(`{"schema":1,"run":"01JRUN","pid":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseRecord(data, "01JRUN")
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrSchemaTooNew) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// Whatever parses must render and parse back to itself.
		out, err := r.Marshal()
		if err != nil {
			t.Fatalf("parsed %+v does not render: %v", r, err)
		}
		if again, err := ParseRecord(out, "01JRUN"); err != nil || again != r {
			t.Fatalf("re-parse %+v: %+v %v", r, again, err)
		}
	})
}

func FuzzParseNames(f *testing.F) {
	f.Add([]byte("a\nb\n"))
	f.Add([]byte("01M8XY4P0P9XSGQATBNB05BKX3\nx/y\n../z"))
	f.Fuzz(func(t *testing.T, data []byte) {
		names, _ := ParseNames(data)
		for _, n := range names {
			if !layout.ValidSandboxRef(n) {
				t.Fatalf("returned invalid name %q", n)
			}
		}
		again, err := ParseNames(RenderNames(names))
		if err != nil || fmt.Sprint(again) != fmt.Sprint(names) {
			t.Fatalf("render round trip %q: %q %v", names, again, err)
		}
	})
}
