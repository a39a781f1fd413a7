// Command kvgate is a KV-cache-aware HTTP proxy for OpenAI-compatible LLM engines.
//
// Each subcommand lives in its own file and registers itself in init, so adding a
// subcommand touches one file.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// repeatable is a flag that may be given several times; each use appends its value.
type repeatable []string

func (r *repeatable) String() string     { return strings.Join(*r, " ") }
func (r *repeatable) Set(v string) error { *r = append(*r, v); return nil }

// flagGroup is a titled run of flags in -h output.
type flagGroup struct {
	title string
	names []string
}

// printFlagGroups writes fs's flags under their group titles, in the groups' order, in
// the layout of flag.PrintDefaults; flags no group names follow under "Other".
func printFlagGroups(w io.Writer, fs *flag.FlagSet, groups []flagGroup) {
	seen := map[string]bool{}
	print := func(title string, names []string) {
		if len(names) == 0 {
			return
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		for _, n := range names {
			f := fs.Lookup(n)
			if f == nil {
				continue
			}
			seen[n] = true
			kind, usage := flag.UnquoteUsage(f)
			line := "  -" + f.Name
			if kind != "" {
				line += " " + kind
			}
			line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
			switch {
			case f.DefValue == "" || f.DefValue == "false" || f.DefValue == "0":
			case kind == "string":
				line += fmt.Sprintf(" (default %q)", f.DefValue)
			default:
				line += " (default " + f.DefValue + ")"
			}
			fmt.Fprintln(w, line)
		}
	}
	for _, g := range groups {
		print(g.title, g.names)
	}
	var rest []string
	fs.VisitAll(func(f *flag.Flag) {
		if !seen[f.Name] {
			rest = append(rest, f.Name)
		}
	})
	print("Other", rest)
}

// command is one kvgate subcommand. run gets the arguments after the subcommand name
// and returns the process exit code (0 ok, 1 runtime failure, 2 bad usage or input).
type command struct {
	summary string
	run     func(args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

func register(name, summary string, run func(args []string, stdin io.Reader, stdout, stderr io.Writer) int) {
	if _, dup := commands[name]; dup {
		panic("kvgate: subcommand registered twice: " + name)
	}
	commands[name] = command{summary: summary, run: run}
}

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func dispatch(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "kvgate: unknown subcommand %q\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(args[1:], stdin, stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kvgate <subcommand> [flags]")
	fmt.Fprintln(w)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'kvgate <subcommand> -h' for its flags.")
}
