package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestBenchFleetRefusesBadFlags: bad -fleet values are refused with exit status 2 and a
// message naming the flag, before anything starts.
func TestBenchFleetRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"-fleet", "0"}, "-fleet"},
		{[]string{"-fleet", "8,1025"}, "-fleet"},
		{[]string{"-fleet", "8,x"}, "-fleet"},
		{[]string{"-fleet", "8", "-fleet-entries", "-1"}, "-fleet-entries"},
		{[]string{"-fleet", "8", "-fleet-rate", "-2"}, "-fleet-rate"},
		{[]string{"-fleet", "8", "-fleet-pub", "libzmq"}, "-fleet-pub"},
		{[]string{"-fleet", "8", "-tokenizer", "words"}, "-tokenizer"},
	} {
		var out, errb bytes.Buffer
		if code := runBench(tc.args, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.flag) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", tc.args, code, errb.String(), tc.flag)
		}
	}
}
