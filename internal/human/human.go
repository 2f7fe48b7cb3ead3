package human

import "fmt"

// Bytes is n bytes in binary units with one decimal: 512B, 4.0KiB,
// 64.0MiB, 1.5GiB.
func Bytes(n int64) string { return bytesWith(n, "") }

// SpacedBytes is Bytes with a space before the unit, as the status page
// writes it: 512 B, 4.0 KiB, 64.0 MiB.
func SpacedBytes(n int64) string { return bytesWith(n, " ") }

func bytesWith(n int64, space string) string {
	const unit = 1024
	if n < 0 {
		return "-" + bytesWith(-n, space)
	}
	if n < unit {
		return fmt.Sprintf("%d%sB", n, space)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%s%ciB", float64(n)/float64(div), space, "KMGTPE"[exp])
}

// ExactBytes is n bytes in the largest binary unit of which it is a whole
// number, as a person writes a size into a file and a parser reads it
// back exactly: 256MiB, 1GiB, 4100KiB, 1000 (bytes).
func ExactBytes(n int64) string {
	if n == 0 {
		return "0"
	}
	for i := 5; i >= 1; i-- {
		if unit := int64(1) << (10 * i); n%unit == 0 {
			return fmt.Sprintf("%d%ciB", n/unit, "KMGTP"[i-1])
		}
	}
	return fmt.Sprintf("%d", n)
}

// Join puts two clauses together as "a; b", either of which may be
// empty (then it is the other alone).
func Join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
