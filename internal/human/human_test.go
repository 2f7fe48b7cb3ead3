package human

import "testing"

func TestBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0B"}, {1023, "1023B"}, {1024, "1.0KiB"}, {64 << 20, "64.0MiB"}, {3 << 29, "1.5GiB"}, {1 << 40, "1.0TiB"}, {-4096, "-4.0KiB"},
	} {
		if got := Bytes(tc.n); got != tc.want {
			t.Errorf("Bytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestSpacedBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {64 << 20, "64.0 MiB"}, {-4096, "-4.0 KiB"},
	} {
		if got := SpacedBytes(tc.n); got != tc.want {
			t.Errorf("SpacedBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestExactBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0"}, {1000, "1000"}, {4096, "4KiB"}, {4100 << 10, "4100KiB"}, {256 << 20, "256MiB"}, {1 << 30, "1GiB"}, {3 << 29, "1536MiB"}, {1 << 50, "1PiB"}, {5 << 50, "5PiB"},
	} {
		if got := ExactBytes(tc.n); got != tc.want {
			t.Errorf("ExactBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestJoin(t *testing.T) {
	for _, tc := range []struct{ a, b, want string }{
		{"", "", ""}, {"a", "", "a"}, {"", "b", "b"}, {"a", "b", "a; b"},
	} {
		if got := Join(tc.a, tc.b); got != tc.want {
			t.Errorf("Join(%q, %q) = %q, want %q", tc.a, tc.b, got, tc.want)
		}
	}
}
