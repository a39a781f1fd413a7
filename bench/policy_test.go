package bench

import (
	"slices"
	"strings"
	"testing"
)

// kv-exact is `kvgate serve -kv-mode 3` with every other default, so it measures what
// ships; the argmax policies pin the overlap policy explicitly; every default policy name
// resolves.
func TestStandardPolicyFlags(t *testing.T) {
	want := map[string][]string{
		"kv-exact":         {"-kv-mode", "3"},
		"kv-exact-overlap": {"-select", "rr", "-kv-mode", "3", "-kv-policy", "overlap", "-kv-score", "overlap"},
		"kv-exact-prefix":  {"-select", "rr", "-kv-mode", "3", "-kv-policy", "overlap", "-kv-score", "prefix"},
		"rr":               {"-select", "rr", "-kv-mode", "off"},
		"chwbl":            {"-select", "chwbl", "-kv-mode", "off"},
		"oracle":           nil,
	}
	for _, n := range strings.Split(DefaultPolicies, ",") {
		p, ok := PolicyByName(n)
		if !ok {
			t.Fatalf("default policy %q does not resolve", n)
		}
		w, known := want[n]
		if !known {
			t.Fatalf("default policy %q has no expected flags here", n)
		}
		if !slices.Equal(p.Flags, w) {
			t.Errorf("%s flags %q, want %q", n, p.Flags, w)
		}
		delete(want, n)
	}
	if len(want) > 0 {
		t.Fatalf("not in the default -policies list: %v", want)
	}
	env := &Env{Model: "qwen3", Tokenizer: "/tok", BlockSize: 16, KvgateArgs: []string{"-kv-load-factor", "1"}}
	p, _ := PolicyByName("kv-exact")
	args := ServeArgs(env, "l", "a", true, p.Flags)
	if got := args[len(args)-4:]; !slices.Equal(got, []string{"-kv-load-factor", "1", "-kv-mode", "3"}) {
		t.Fatalf("serve args end %q", got)
	}
}
