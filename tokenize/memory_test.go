package tokenize

import (
	"runtime"
	"testing"

	"github.com/kvgate/kvgate/internal/testfix"
)

// TestMemoryBytes checks the estimate against the heap a fresh load actually retains.
func TestMemoryBytes(t *testing.T) {
	path := testfix.TokenizerDir(t, "llama3") + "/tokenizer.json"
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tk, err := LoadTokenizer(path)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	retained := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	est := tk.MemoryBytes()
	t.Logf("llama3: MemoryBytes %d MB, heap retained by the load %d MB", est>>20, retained>>20)
	if est < retained/2 || est > retained*2 {
		t.Errorf("MemoryBytes %d is not within 2x of the retained heap %d", est, retained)
	}
	runtime.KeepAlive(tk)
}
