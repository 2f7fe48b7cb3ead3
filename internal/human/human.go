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
