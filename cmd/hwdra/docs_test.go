// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	logsapi "k8s.io/component-base/logs/api/v1"
)

// The docs a newcomer reads, relative to the repository's root: the
// README, every guide under docs/, the real-node suite's README.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(guides) == 0 {
		t.Fatalf("no docs/*.md under %s: %v", root, err)
	}
	files := []string{"README.md", "SECURITY.md", filepath.Join("test", "e2e", "README.md")}
	for _, g := range guides {
		rel, _ := filepath.Rel(root, g)
		files = append(files, rel)
	}
	slices.Sort(files)
	return files
}

// A doc, split as markdown splits it: fenced blocks (with their info
// string) and the prose around them, where inline code, links and
// headings are.
type doc struct {
	path   string // relative to the repository's root
	text   string
	prose  string // the text with every fenced line blanked, so offsets keep their lines
	blocks []fence
}

type fence struct {
	info  string
	line  int // of the first line inside the fence
	lines []string
}

func readDoc(t *testing.T, root, path string) doc {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	d := doc{path: path, text: string(data)}
	lines := strings.Split(d.text, "\n")
	prose := make([]string, len(lines))
	var open *fence
	for i, l := range lines {
		trimmed := strings.TrimSpace(l)
		switch {
		case open == nil && strings.HasPrefix(trimmed, "```"):
			open = &fence{info: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), line: i + 2}
		case open != nil && strings.HasPrefix(trimmed, "```"):
			d.blocks = append(d.blocks, *open)
			open = nil
		case open != nil:
			open.lines = append(open.lines, l)
		default:
			prose[i] = l
		}
	}
	if open != nil {
		t.Fatalf("%s:%d: a fence is never closed", path, open.line-1)
	}
	d.prose = strings.Join(prose, "\n")
	return d
}

// lineOf is the line of an offset in the doc.
func (d doc) lineOf(offset int) int { return strings.Count(d.prose[:offset], "\n") + 1 }

// A command the docs show: its words, where it is, whether it is in a
// fenced shell block (else in inline code).
type docCommand struct {
	where  string
	words  []string
	fenced bool
}

// shellCommands are the simple commands of a fenced shell block: a
// console block's "$ " lines, every line of an sh or bash block, with
// continuation lines joined, comments dropped and pipelines, lists and
// command substitutions split.
func shellCommands(d doc) []docCommand {
	var out []docCommand
	for _, b := range d.blocks {
		lang := strings.Fields(b.info + " ")
		if len(lang) == 0 || !slices.Contains([]string{"sh", "bash", "shell", "console"}, lang[0]) {
			continue
		}
		for i := 0; i < len(b.lines); i++ {
			start, line := b.line+i, b.lines[i]
			if lang[0] == "console" {
				cmd, ok := strings.CutPrefix(strings.TrimSpace(line), "$ ")
				if !ok {
					continue
				}
				line = cmd
			}
			for strings.HasSuffix(line, `\`) && i+1 < len(b.lines) {
				i++
				line = strings.TrimSuffix(line, `\`) + " " + b.lines[i]
			}
			for _, words := range splitShell(line) {
				out = append(out, docCommand{where: fmt.Sprintf("%s:%d", d.path, start), words: words, fenced: true})
			}
		}
	}
	return out
}

// splitShell splits a command line into simple commands and those into
// words, as sh does for what the docs use: quotes, backslashes, comments,
// |, ||, &&, ;, & and $( ... ). Nothing is expanded.
func splitShell(line string) [][]string {
	var (
		cmds  [][]string
		words []string
		word  strings.Builder
		inW   bool
	)
	endWord := func() {
		if inW {
			words = append(words, word.String())
			word.Reset()
			inW = false
		}
	}
	endCmd := func() {
		endWord()
		if len(words) > 0 {
			cmds = append(cmds, words)
		}
		words = nil
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				j = len(line) - i - 1
			}
			word.WriteString(line[i+1 : i+1+j])
			inW, i = true, i+1+j
		case c == '"':
			j := strings.IndexByte(line[i+1:], '"')
			if j < 0 {
				j = len(line) - i - 1
			}
			word.WriteString(line[i+1 : i+1+j])
			inW, i = true, i+1+j
		case c == '\\' && i+1 < len(line):
			word.WriteByte(line[i+1])
			inW, i = true, i+1
		case c == '#' && !inW:
			endCmd()
			return cmds
		case c == '$' && i+1 < len(line) && line[i+1] == '(':
			endCmd()
			i++
		case strings.IndexByte("|&;)", c) >= 0:
			endCmd()
		case c == ' ' || c == '\t':
			endWord()
		default:
			word.WriteByte(c)
			inW = true
		}
	}
	endCmd()
	return cmds
}

var envAssignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// hwdraArgs are the arguments a command gives hwdra, if it runs hwdra:
// `hwdra ...` or `go run ./cmd/hwdra ...`, after variable assignments or
// `export`.
func hwdraArgs(words []string) ([]string, bool) {
	for len(words) > 0 && envAssignment.MatchString(words[0]) {
		words = words[1:]
	}
	switch {
	case len(words) >= 1 && words[0] == "hwdra":
		return words[1:], true
	case len(words) >= 3 && words[0] == "go" && words[1] == "run" && strings.TrimSuffix(words[2], "/") == "./cmd/hwdra":
		return words[3:], true
	}
	return nil, false
}

// checkHwdraCommand: the subcommand exists and takes every flag given, as
// the real command line parses them. It returns the subcommand's path.
func checkHwdraCommand(args []string) (string, error) {
	root := newRootCommand()
	cmd, rest, err := root.Find(args)
	if err != nil {
		return "", err
	}
	if cmd == root {
		return "", fmt.Errorf("no subcommand")
	}
	cmd.InitDefaultHelpFlag()
	if err := cmd.ParseFlags(rest); err != nil {
		return "", fmt.Errorf("%s: %w", cmd.CommandPath(), err)
	}
	return cmd.CommandPath(), nil
}

// runnable: commands that need no cluster and no hardware, run for real
// (doctor without a kubeconfig: its API checks are skipped).
func runnable(path string, args []string) bool {
	switch path {
	case "hwdra version":
		return true
	case "hwdra lab", "hwdra probe", "hwdra slices", "hwdra doctor":
		root := newRootCommand()
		cmd, rest, _ := root.Find(args)
		_ = cmd.ParseFlags(rest)
		return strings.HasPrefix(cmd.Flags().Lookup("hardware").Value.String(), "mock:")
	}
	return false
}

var (
	inlineCode = regexp.MustCompile("`([^`]+)`")
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	hackScript = regexp.MustCompile(`hack/[A-Za-z0-9_.-]*[A-Za-z0-9_-]`)
	heading    = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *#* *$`)
)

// repoPath: the repository path a word names, if it names one: its first
// folder is one of the repository's top-level folders.
func repoPath(word string, top map[string]bool) (string, bool) {
	if i := strings.LastIndexByte(word, '='); i >= 0 {
		word = word[i+1:]
	}
	word = strings.Trim(word, `"'(),;:`)
	word = strings.TrimPrefix(word, "./")
	word = strings.TrimSuffix(word, "/...")
	first, _, ok := strings.Cut(word, "/")
	if !ok || !top[first] || strings.ContainsAny(word, "<>{}$…") {
		return "", false
	}
	return word, true
}

func pathExists(root, p string) bool {
	if strings.ContainsAny(p, "*?[") {
		m, _ := filepath.Glob(filepath.Join(root, p))
		return len(m) > 0
	}
	_, err := os.Stat(filepath.Join(root, p))
	return err == nil
}

// anchors are the link targets of a doc's headings, as GitHub makes them:
// lower case, punctuation dropped, spaces as hyphens, repeats numbered.
func anchors(d doc) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(d.prose, -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || r == '-':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestDocs: what the docs tell a reader to run runs, and what they point
// at is there. Every command of a fenced shell block (and of inline code)
// that runs hwdra names a subcommand that exists and only flags it takes,
// parsed by the real command line; the ones that need no cluster and no
// hardware (lab, probe, slices on mock hardware, version) run. Every
// repository path a command or inline code names exists, every hack/
// script named anywhere exists, and every relative link resolves to a
// file in the repository and, into a markdown file, to one of its
// headings.
func TestDocs(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	top := map[string]bool{}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != ".git" {
			top[e.Name()] = true
		}
	}
	docs := map[string]doc{}
	var order []string
	for _, f := range docFiles(t, root) {
		docs[f] = readDoc(t, root, f)
		order = append(order, f)
	}

	var toRun []docCommand
	t.Run("commands", func(t *testing.T) {
		seen := map[string]bool{}
		for _, f := range order {
			d := docs[f]
			cmds := shellCommands(d)
			for _, m := range inlineCode.FindAllStringSubmatchIndex(d.prose, -1) {
				span := strings.Join(strings.Fields(d.prose[m[2]:m[3]]), " ")
				for _, words := range splitShell(span) {
					cmds = append(cmds, docCommand{where: fmt.Sprintf("%s:%d", f, d.lineOf(m[0])), words: words})
				}
			}
			for _, c := range cmds {
				args, ok := hwdraArgs(c.words)
				if !ok || len(args) == 0 {
					continue
				}
				path, err := checkHwdraCommand(args)
				if err != nil {
					t.Errorf("%s: %s: %v", c.where, strings.Join(c.words, " "), err)
					continue
				}
				key := strings.Join(args, "\x00")
				if c.fenced && runnable(path, args) && !seen[key] {
					seen[key] = true
					toRun = append(toRun, docCommand{where: c.where, words: args})
				}
			}
		}
	})

	t.Run("paths", func(t *testing.T) {
		for _, f := range order {
			d := docs[f]
			var words []struct {
				where, word string
			}
			for _, c := range shellCommands(d) {
				for _, w := range c.words {
					words = append(words, struct{ where, word string }{c.where, w})
				}
			}
			for _, m := range inlineCode.FindAllStringSubmatchIndex(d.prose, -1) {
				for _, w := range strings.Fields(d.prose[m[2]:m[3]]) {
					words = append(words, struct{ where, word string }{fmt.Sprintf("%s:%d", f, d.lineOf(m[0])), w})
				}
			}
			for _, w := range words {
				if p, ok := repoPath(w.word, top); ok && !pathExists(root, p) {
					t.Errorf("%s: %s: no such file or folder in the repository", w.where, p)
				}
			}
			for _, m := range hackScript.FindAllStringIndex(d.text, -1) {
				if p := d.text[m[0]:m[1]]; !pathExists(root, p) {
					t.Errorf("%s:%d: %s: no such script", f, strings.Count(d.text[:m[0]], "\n")+1, p)
				}
			}
			// A newcomer's clone has only the repository.
			for _, bad := range []string{"/work/", "../shared"} {
				if i := strings.Index(d.text, bad); i >= 0 {
					t.Errorf("%s:%d: names %q, outside the repository", f, strings.Count(d.text[:i], "\n")+1, bad)
				}
			}
		}
	})

	t.Run("links", func(t *testing.T) {
		for _, f := range order {
			d := docs[f]
			for _, m := range mdLink.FindAllStringSubmatchIndex(d.prose, -1) {
				target := d.prose[m[2]:m[3]]
				where := fmt.Sprintf("%s:%d", f, d.lineOf(m[0]))
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				rel := f
				if file != "" {
					rel = filepath.Join(filepath.Dir(f), file)
				}
				if strings.HasPrefix(rel, "..") || filepath.IsAbs(file) || strings.SplitN(rel, string(filepath.Separator), 2)[0] == "shared" {
					t.Errorf("%s: %s: outside the repository", where, target)
					continue
				}
				if !pathExists(root, rel) {
					t.Errorf("%s: %s: no such file", where, target)
					continue
				}
				if anchor == "" || !strings.HasSuffix(rel, ".md") {
					continue
				}
				to, ok := docs[rel]
				if !ok {
					to = readDoc(t, root, rel)
				}
				if !anchors(to)[anchor] {
					t.Errorf("%s: %s: %s has no heading #%s", where, target, rel, anchor)
				}
			}
		}
	})

	t.Run("run", func(t *testing.T) {
		if len(toRun) == 0 {
			t.Fatal("no command of the docs runs without a cluster: the quick start's lab at least should")
		}
		t.Chdir(root) // the docs' paths are the repository's
		// No cluster: hwdra doctor skips its API checks rather than ask one
		// this machine's kubeconfig may name.
		t.Setenv("KUBERNETES_SERVICE_HOST", "")
		t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
		for _, c := range toRun {
			if err := logsapi.ResetForTest(nil); err != nil {
				t.Fatal(err)
			}
			root := newRootCommand()
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			root.SilenceUsage = true // the error says what is wrong
			root.SetArgs(c.words)
			if err := root.ExecuteContext(context.Background()); err != nil {
				lines := strings.Split(strings.TrimSpace(out.String()), "\n")
				t.Errorf("%s: hwdra %s: %v\n...\n%s", c.where, strings.Join(c.words, " "), err, strings.Join(lines[max(0, len(lines)-10):], "\n"))
			} else {
				t.Logf("%s: hwdra %s: ok", c.where, strings.Join(c.words, " "))
			}
		}
	})
}

// The docs' own parsing holds: a check that reads nothing passes nothing.
func TestDocsParsing(t *testing.T) {
	got := splitShell(`HWDRA_X=1 go run ./cmd/hwdra lab --claim 'a b' c\ d | grep -E 'x|y' && bin=$(hack/build.sh) # comment`)
	want := [][]string{{"HWDRA_X=1", "go", "run", "./cmd/hwdra", "lab", "--claim", "a b", "c d"}, {"grep", "-E", "x|y"}, {"bin="}, {"hack/build.sh"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("splitShell:\n got %q\nwant %q", got, want)
	}
	if args, ok := hwdraArgs(want[0]); !ok || fmt.Sprint(args) != "[lab --claim a b c d]" {
		t.Errorf("hwdraArgs: %q %v", args, ok)
	}
	for _, bad := range [][]string{{"nope"}, {"slices", "--no-such-flag"}, {"mock", "inject", "--gpu-instances", "1"}} {
		if _, err := checkHwdraCommand(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	d := doc{prose: "# A `b` — c\n## Why? Now!\n## Why? Now!\n"}
	for _, a := range []string{"a-b--c", "why-now", "why-now-1"} {
		if !anchors(d)[a] {
			t.Errorf("no anchor %q in %v", a, anchors(d))
		}
	}
}
