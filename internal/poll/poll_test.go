package poll

import (
	"testing"
	"time"
)

func TestWithinReportsWhetherTheConditionHeldInTime(t *testing.T) {
	calls := 0
	if !Within(time.Second, time.Millisecond, func() bool { calls++; return calls == 3 }) {
		t.Fatal("a condition that holds on the third call: Within says it never held")
	}
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3 (it stops once the condition holds)", calls)
	}
	began := time.Now()
	if Within(20*time.Millisecond, time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds: Within says it held")
	}
	if took := time.Since(began); took < 20*time.Millisecond {
		t.Fatalf("Within gave up after %s, before its timeout of 20ms", took)
	}
}
