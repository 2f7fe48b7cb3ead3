package human

import "fmt"

// Bytes is n bytes in binary units with one decimal: 512B, 4.0KiB,
// 64.0MiB, 1.5GiB.
func Bytes(n int64) string {
	const unit = 1024
	if n < 0 {
		return "-" + Bytes(-n)
	}
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
