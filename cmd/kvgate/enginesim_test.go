package main

import (
	"bytes"
	"strings"
	"testing"
)

// -h lists every flag once, under the group of the engine part it sets, groups in order,
// and nothing under "Other" (a new flag must be put in a group).
func TestEngineSimHelpGroupsEveryFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	if rc := runEngineSim([]string{"-h"}, nil, &out, &errOut); rc != 0 {
		t.Fatalf("rc %d", rc)
	}
	help := errOut.String()
	if strings.Contains(help, "\nOther:\n") {
		t.Errorf("flags outside every group:\n%s", help[strings.Index(help, "\nOther:\n"):])
	}
	at := 0
	listed := map[string]int{}
	for _, g := range engineSimFlagGroups {
		i := strings.Index(help, "\n"+g.title+":\n")
		if i < at {
			t.Fatalf("group %q missing or out of order:\n%s", g.title, help)
		}
		at = i
		for _, n := range g.names {
			listed[n]++
		}
	}
	shown := 0
	for _, line := range strings.Split(help, "\n") {
		if name, ok := strings.CutPrefix(line, "  -"); ok && !strings.HasPrefix(line, "  -  ") {
			name, _, _ = strings.Cut(name, " ")
			if listed[name] != 1 {
				t.Errorf("-%s is in %d groups", name, listed[name])
			}
			shown++
		}
	}
	if shown != len(listed) || shown < 25 {
		t.Errorf("%d flags shown, %d grouped", shown, len(listed))
	}
}

func TestEngineSimRefusesBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-tokenize-drift"}, "-tokenize-drift needs -tokenizer"},
		{[]string{"-tokenizer", "/nonexistent"}, "-tokenizer"},
		{[]string{"-no-such-flag"}, "no-such-flag"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-engine", "tgi", "-kv-events", ""}, "unknown engine"},
	} {
		var out, errOut bytes.Buffer
		if rc := runEngineSim(c.args, nil, &out, &errOut); rc != 2 || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("%v: rc %d, stderr %q, want 2 and %q", c.args, rc, errOut.String(), c.want)
		}
	}
}
