package main

import (
	"fmt"
	"math/big"
	"strings"
)

// parseSize reads a size flag: a number of bytes, possibly with a
// fraction, and an optional binary unit (B, or K, M, G, T, P with or
// without "iB", any case): "1.5GiB", "512M", "4096". The result must be a whole
// number of bytes. node.ParseSize (the config file's sizes) takes no
// fraction yet.
func parseSize(s string) (int64, error) {
	in := strings.TrimSpace(s)
	num := strings.TrimRight(in, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
	unit := strings.ToLower(strings.TrimSpace(in[len(num):]))
	num = strings.TrimSpace(num)
	shift := -1
	for i, u := range []string{"", "k", "m", "g", "t", "p"} {
		if unit == u || (u != "" && unit == u+"ib") || (u == "" && unit == "b") {
			shift = 10 * i
		}
	}
	bad := fmt.Errorf("size %q: want a number of bytes with an optional unit, such as 1.5GiB, 512MiB or 4096", s)
	if shift < 0 || num == "" || strings.ContainsAny(num, "eE+-/") {
		return 0, bad
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, bad
	}
	r.Mul(r, new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), uint(shift))))
	if !r.IsInt() {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", s)
	}
	n := r.Num()
	if !n.IsInt64() || n.Int64() > 1<<62 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n.Int64(), nil
}
