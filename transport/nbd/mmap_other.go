//go:build !linux

package nbd

import "errors"

// mapBuffer is only implemented on Linux; elsewhere every buffer comes from the Go heap.
func mapBuffer(int) ([]byte, error) { return nil, errors.ErrUnsupported }

func discardPages([]byte) { panic("nbd: discardPages without mapBuffer") }

func unmapBuffer([]byte) { panic("nbd: unmapBuffer without mapBuffer") }
