package prepare

import (
	"os"
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

func TestNewerLedgerIsLeftAlone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.json")
	newer := []byte(`{"version":"hwdra.io/ledger/v2","entries":{"x":1}}`)
	if err := slotfile.Replace(path, newer); err != nil {
		t.Fatal(err)
	}
	l, err := OpenLedger[int](path)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Keys()) != 0 {
		t.Fatalf("read the newer ledger's entries: %v", l.Keys())
	}
	l.Put("a", 1)
	if raw, _ := os.ReadFile(path); string(raw) != string(newer) {
		t.Fatalf("the newer ledger changed: %s", raw)
	}
	if again, _ := OpenLedger[int](path); len(again.Keys()) != 1 || again.Keys()[0] != "a" {
		t.Fatalf("this agent's own ledger after a reopen: %v", again.Keys())
	}
}
