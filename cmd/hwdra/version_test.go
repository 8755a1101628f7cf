package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersionStampedByLdflags: a build without Go's VCS stamp
// (-buildvcs=false, as in a container without .git) still says its
// version and commit when built with hack/version-ldflags.sh, as the
// image is.
func TestVersionStampedByLdflags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	flags, err := exec.Command("../../hack/version-ldflags.sh").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "hwdra")
	build := exec.Command("go", "build", "-buildvcs=false", "-tags", "nolab,grpcnotrace", "-ldflags", strings.TrimSpace(string(flags)), "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "commit: " + strings.TrimSpace(string(head)); !strings.Contains(string(out), want) {
		t.Errorf("hwdra version says\n%s\nwant %q", out, want)
	}
	if !strings.HasPrefix(string(out), "hwdra 0.") {
		t.Errorf("no chart version: %s", out)
	}
}
