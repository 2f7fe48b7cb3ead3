package caps

import (
	"os"
	"testing"
)

// TestHasAgreesWithTheEffectiveSet: root in the test's environment may
// lack some capabilities (a container), so the test compares Has with the
// set Effective reads, and checks the set is not empty for root.
func TestHasAgreesWithTheEffectiveSet(t *testing.T) {
	eff, err := Effective()
	if err != nil {
		t.Fatal(err)
	}
	for _, bit := range []uint{SysAdmin, SysResource} {
		has, err := Has(bit)
		if err != nil {
			t.Fatal(err)
		}
		if has != (eff&(1<<bit) != 0) {
			t.Fatalf("Has(%d) = %v with CapEff %x", bit, has, eff)
		}
	}
	if os.Geteuid() == 0 && eff == 0 {
		t.Fatal("root with an empty effective capability set: CapEff was not read")
	}
}
