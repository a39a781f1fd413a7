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
	checkFlagGroups(t, errOut.String(), engineSimFlagGroups, 25, false)
}

// checkFlagGroups checks a grouped -h: nothing under "Other", every group's heading
// present and in order, every flag shown in exactly one group, at least min of them, and
// (withDefaults) each with a stated default.
func checkFlagGroups(t *testing.T, help string, groups []flagGroup, min int, withDefaults bool) {
	t.Helper()
	if i := strings.Index(help, "\nOther:\n"); i >= 0 {
		t.Errorf("flags outside every group:\n%s", help[i:])
	}
	at := 0
	listed := map[string]int{}
	for _, g := range groups {
		i := strings.Index(help, "\n"+g.title+":\n")
		if i < at {
			t.Fatalf("group %q missing or out of order:\n%s", g.title, help)
		}
		at = i
		for _, n := range g.names {
			listed[n]++
		}
	}
	lines := strings.Split(help, "\n")
	shown := 0
	for i, line := range lines {
		name, ok := strings.CutPrefix(line, "  -")
		if !ok || strings.HasPrefix(line, "  -  ") {
			continue
		}
		name, _, _ = strings.Cut(name, " ")
		if listed[name] != 1 {
			t.Errorf("-%s is in %d groups", name, listed[name])
		}
		if withDefaults && (i+1 >= len(lines) || !strings.Contains(lines[i+1], "(default ")) {
			t.Errorf("-%s states no default", name)
		}
		shown++
	}
	if shown != len(listed) || shown < min {
		t.Errorf("%d flags shown, %d grouped", shown, len(listed))
	}
}
