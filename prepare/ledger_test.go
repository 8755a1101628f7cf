package prepare

import (
	"path/filepath"
	"testing"

	"github.com/hwdra/hwdra/internal/slotfile"
)

func TestLedgerPersistsAndRecoversFromCorruption(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.json")
	l, err := OpenLedger[int](path)
	if err != nil {
		t.Fatal(err)
	}
	l.Put("b", 2)
	l.Put("a", 1)
	l.Delete("b")
	l2, _ := OpenLedger[int](path)
	if keys := l2.Keys(); len(keys) != 1 || keys[0] != "a" {
		t.Fatalf("reopened ledger has %v", keys)
	}
	slotfile.Replace(path, []byte("{garbage"))
	l3, err := OpenLedger[int](path)
	if err != nil || len(l3.Keys()) != 0 {
		t.Fatalf("corrupt ledger: %v %v", l3.Keys(), err)
	}
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) != 1 {
		t.Fatal("corrupt ledger not set aside")
	}
}
