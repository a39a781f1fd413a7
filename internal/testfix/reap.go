package testfix

import (
	"io"
	"os/exec"
	"time"
)

// Cleaner is the part of testing.TB that registers cleanups.
type Cleaner interface{ Cleanup(func()) }

// ReapOnCleanup ends a started helper process when the test ends: it closes the
// process's stdin (the helpers exit on EOF), waits up to 5 s, then kills it, so no test
// leaves a python peer behind or hangs on one that does not exit.
func ReapOnCleanup(t Cleaner, cmd *exec.Cmd, stdin io.Closer) {
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
}
