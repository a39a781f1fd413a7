package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/hashcore"
)

// hashGoldenCase is one case of testdata/hash/*.json (tools/gen-hash-goldens.py, Python
// pickle/hashlib, cbor2 and xxhash as oracles).
type hashGoldenCase struct {
	Name      string   `json:"name"`
	Algo      string   `json:"algo"`
	BlockSize int      `json:"block_size"`
	SeedSet   bool     `json:"seed_set"`
	Seed      string   `json:"seed"`
	LoRAName  string   `json:"lora_name"`
	CacheSalt string   `json:"cache_salt"`
	Tokens    []uint32 `json:"tokens"`
	NoneHash  string   `json:"none_hash"`
	Keys      []uint64 `json:"keys"`
	Digests   []string `json:"digests"`
}

func loadHashGolden(t *testing.T, file string) []hashGoldenCase {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "hash", file))
	if err != nil {
		t.Fatalf("%v (regenerate with `make goldens`)", err)
	}
	var doc struct {
		Cases []hashGoldenCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Cases
}

func runHashCLI(args []string, stdin string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = dispatch(append([]string{"hash"}, args...), strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

type hashOutput struct {
	Keys     []uint64 `json:"keys"`
	NoneHash *string  `json:"none_hash"`
	Digests  []string `json:"digests"`
}

func TestHashCommandMatchesGoldens(t *testing.T) {
	ran := map[string]int{}
	for _, gc := range loadHashGolden(t, "vllm.json") {
		if gc.Tokens == nil || ran[gc.Algo+gc.Name] >= 3 {
			continue // a few cases per algo and kind keep this test quick
		}
		ran[gc.Algo+gc.Name]++
		args := []string{"-engine", "vllm", "-algo", gc.Algo, "-block-size", fmt.Sprint(gc.BlockSize), "-digests"}
		if gc.SeedSet {
			args = append(args, "-seed", gc.Seed)
		}
		if gc.LoRAName != "" {
			args = append(args, "-lora-name", gc.LoRAName)
		}
		if gc.CacheSalt != "" {
			args = append(args, "-cache-salt", gc.CacheSalt)
		}
		in, _ := json.Marshal(gc.Tokens)
		code, stdout, stderr := runHashCLI(args, string(in))
		if code != 0 {
			t.Fatalf("%s %v: exit %d: %s", gc.Name, args, code, stderr)
		}
		var got hashOutput
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatalf("%s: output %q: %v", gc.Name, stdout, err)
		}
		if fmt.Sprint(got.Keys) != fmt.Sprint(gc.Keys) && !(len(got.Keys) == 0 && len(gc.Keys) == 0) {
			t.Errorf("%s %v: keys %v, want %v", gc.Name, args, got.Keys, gc.Keys)
		}
		if got.NoneHash == nil || *got.NoneHash != gc.NoneHash {
			t.Errorf("%s %v: none_hash %v, want %s", gc.Name, args, got.NoneHash, gc.NoneHash)
		}
		if strings.Join(got.Digests, ",") != strings.Join(gc.Digests, ",") {
			t.Errorf("%s %v: digests differ", gc.Name, args)
		}
	}
	if len(ran) < 8 {
		t.Fatalf("only %d golden kinds exercised", len(ran))
	}
}

func TestHashCommandPublishedVectors(t *testing.T) {
	// CONTRACTS.md §1.1: sha256_cbor, seed unset, [1,2,3,4], B=4; §2: SGLang page 4.
	code, out, errs := runHashCLI([]string{"-engine", "vllm", "-algo", "sha256_cbor", "-block-size", "4"}, "[1,2,3,4]")
	if code != 0 || out != "{\"keys\":[9561501211280363793]}\n" {
		t.Errorf("vllm: exit %d out %q err %q", code, out, errs)
	}
	code, out, errs = runHashCLI([]string{"-engine", "sglang", "-algo", "sha256", "-block-size", "4", "-digests"}, " [1, 2, 3, 4, 5] ")
	var got hashOutput
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("sglang: exit %d out %q err %q", code, out, errs)
	}
	if len(got.Keys) != 1 || int64(got.Keys[0]) != -3488128144981237669 || got.NoneHash != nil || len(got.Digests) != 1 {
		t.Errorf("sglang: %s", out)
	}
	// Defaults: vllm, sha256 (pickle), block 16; a partial block has no key.
	code, out, _ = runHashCLI(nil, "[1,2,3]")
	if code != 0 || out != "{\"keys\":[]}\n" {
		t.Errorf("defaults: exit %d out %q", code, out)
	}
	code, out, _ = runHashCLI([]string{"-engine", "kvgate", "-block-size", "2"}, "[1,2,3,4]")
	want := hashcore.Keys(hashcore.NewFast(2), nil, []uint32{1, 2, 3, 4}, nil)
	if code != 0 || out != fmt.Sprintf("{\"keys\":[%d,%d]}\n", want[0], want[1]) {
		t.Errorf("kvgate: exit %d out %q", code, out)
	}
}

func TestHashCommandBadInput(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{nil, "not json", "not a JSON array"},
		{nil, "", "empty input"},
		{nil, `{"a":1}`, "not a JSON array"},
		{nil, "null", "null"},
		{nil, "[1,-2]", "token 1 (-2) is negative"},
		{nil, "[4294967296]", "token 0 (4294967296) exceeds 2^32-1"},
		{nil, "[99999999999999999999999]", "token 0"},
		{nil, "[1.5]", "token 0 (1.5) is not an integer"},
		{nil, "[1e3]", "not an integer"},
		{nil, `[1,"2"]`, "token 1 is a string"},
		{nil, "[1] [2]", "trailing data"},
		{[]string{"-algo", "md5"}, "[1]", `unknown vllm algo "md5"`},
		{[]string{"-block-size", "0"}, "[1]", "block size 0"},
		{[]string{"-block-size", "-4"}, "[1]", "block size -4"},
		{[]string{"-engine", "trtllm"}, "[1]", `unknown engine "trtllm"`},
		{[]string{"-algo", "xxhash"}, "[1]", "random"},
		{[]string{"-engine", "sglang", "-lora-name", "x"}, "[1]", "no extra keys"},
		{[]string{"-lora-name", "\xff"}, "[1]", "UTF-8"},
		{[]string{"-engine", "sglang", "-seed", "0"}, "[1]", "vllm only"},
		{[]string{"-bogus"}, "[1]", "flag provided but not defined"},
		{[]string{"extra"}, "[1]", "unexpected argument"},
	} {
		code, out, errs := runHashCLI(tc.args, tc.stdin)
		if code != 2 || out != "" {
			t.Errorf("%v < %q: exit %d, stdout %q; want exit 2 and no output", tc.args, tc.stdin, code, out)
			continue
		}
		if !strings.Contains(errs, tc.want) {
			t.Errorf("%v < %q: stderr %q does not say %q", tc.args, tc.stdin, errs, tc.want)
		}
		if tc.args == nil || tc.args[0] != "-bogus" {
			if n := strings.Count(strings.TrimSpace(errs), "\n"); n != 0 {
				t.Errorf("%v < %q: want one line, got %q", tc.args, tc.stdin, errs)
			}
		}
	}
}

// TestHashRefusalsNameTheFlag: each contract parameter hashcore refuses is reported with
// the flag that sets it, taken from the error's typed parameter.
func TestHashRefusalsNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"-engine", "tgi"}, "-engine"},
		{[]string{"-algo", "md5"}, "-algo"},
		{[]string{"-engine", "sglang", "-algo", "xxhash"}, "-algo"},
		{[]string{"-block-size", "0"}, "-block-size"},
		{[]string{"-algo", "xxhash"}, "-seed"},
		{[]string{"-seed", "\xff"}, "-seed"},
		{[]string{"-lora-name", "\xff"}, "-lora-name"},
		{[]string{"-cache-salt", strings.Repeat("s", hashcore.MaxStringLen+1)}, "-cache-salt"},
	} {
		code, _, errs := runHashCLI(tc.args, "[1]")
		if code != 2 || !strings.HasPrefix(errs, "kvgate hash: "+tc.flag+": hashcore: ") {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", tc.args, code, errs, tc.flag)
		}
	}
}

func TestVersionCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"version"}, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	s := out.String()
	for _, want := range []string{"kvgate ", "cpu: " + hashcore.CPUFeatures() + "\n", "sha256: " + hashcore.SHA256Path(), "xxh3: "} {
		if !strings.Contains(s, want) {
			t.Errorf("version output %q lacks %q", s, want)
		}
	}
	out.Reset()
	errb.Reset()
	if code := dispatch([]string{"version", "now"}, strings.NewReader(""), &out, &errb); code != 2 || out.Len() != 0 {
		t.Errorf("version now: exit %d out %q", code, out.String())
	}
}
