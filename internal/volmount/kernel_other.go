//go:build !linux

package volmount

import (
	"errors"
	"log"
	"os"
)

var errNoKernelNBD = errors.New("the kernel's nbd driver is Linux's")

func serveKernel(HelperConfig, *log.Logger, func(ready), <-chan os.Signal) error {
	return errNoKernelNBD
}

func disconnectNBD(string) error { return errNoKernelNBD }

func growLoops(string) ([]string, error) { return nil, errors.New("loop devices are Linux's") }
