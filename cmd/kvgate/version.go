package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/kvgate/kvgate/hashcore"
)

func init() {
	register("version", "print the build and the CPU features used for hashing", runVersion)
}

func runVersion(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvgate version")
		fmt.Fprintln(stderr, "Prints the build and the CPU features kvgate's hashing uses (SHA-NI, AVX2, AVX-512).")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvgate version: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	version := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	_, err := fmt.Fprintf(stdout, "kvgate %s\ngo: %s %s/%s\ncpu: %s\nsha256: %s\nxxh3: %s (github.com/zeebo/xxh3)\n",
		version, runtime.Version(), runtime.GOOS, runtime.GOARCH,
		hashcore.CPUFeatures(), hashcore.SHA256Path(), hashcore.XXH3Path())
	if err != nil {
		return 1
	}
	return 0
}
