package bench

import (
	"bytes"
	"os"
	"strconv"
)

// stealWarnPercent is the host steal (percent of the machine's CPU time in a measuring
// window) from which the fleet and overhead runs warn that they measured a slowed
// machine: one percent of two cores is 20 ms a second taken from processes that had work.
const stealWarnPercent = 1.0

// hostTicks is the machine's CPU time so far from /proc/stat's aggregate "cpu" line, in
// clock ticks summed over every CPU: all of it, and the part the hypervisor gave to
// other guests while this one had work (steal). On a shared virtual machine steal is
// time every process here waited for, so a window with much of it measured a slower
// machine, whatever it compared.
type hostTicks struct {
	total, steal uint64
}

// readHostTicks reads /proc/stat; ok is false where it cannot (not Linux).
func readHostTicks() (hostTicks, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostTicks{}, false
	}
	return parseHostTicks(b)
}

// parseHostTicks reads the aggregate line "cpu  user nice system idle iowait irq softirq
// steal guest guest_nice" (proc(5)). Guest time is already counted in user and nice, so
// it is left out of the total. Kernels before 2.6.11 have no steal field: ok is false.
func parseHostTicks(stat []byte) (hostTicks, bool) {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return hostTicks{}, false
	}
	var t hostTicks
	for i := 1; i <= 8; i++ {
		v, err := strconv.ParseUint(string(f[i]), 10, 64)
		if err != nil {
			return hostTicks{}, false
		}
		t.total += v
		if i == 8 {
			t.steal = v
		}
	}
	return t, true
}

// stealPercent is the share of the machine's CPU time between two readings that was
// stolen, in percent; 0 when nothing elapsed.
func stealPercent(from, to hostTicks) float64 {
	if to.total <= from.total || to.steal < from.steal {
		return 0
	}
	return float64(to.steal-from.steal) / float64(to.total-from.total) * 100
}

// stealWindow accumulates steal over several measuring windows (the overhead bench's
// alternating rounds of one path). A failed reading spoils the whole account.
type stealWindow struct {
	bad          bool
	windows      int
	start, spent hostTicks // spent: the windows' ticks summed
}

func (w *stealWindow) begin() {
	var ok bool
	if w.start, ok = readHostTicks(); !ok {
		w.bad = true
	}
}

func (w *stealWindow) end() {
	t, ok := readHostTicks()
	if w.bad || !ok || t.total < w.start.total || t.steal < w.start.steal {
		w.bad = true
		return
	}
	w.windows++
	w.spent.total += t.total - w.start.total
	w.spent.steal += t.steal - w.start.steal
}

// percent is the steal over every window so far; -1 when it could not be read.
func (w *stealWindow) percent() float64 {
	if w.bad || w.windows == 0 {
		return -1
	}
	return stealPercent(hostTicks{}, w.spent)
}
