// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package drivertools

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hwdra/hwdra/internal/mock/fault"
)

// smi is nvidia-smi as far as the agent uses it:
//
//	nvidia-smi compute-policy -i <GPU UUID or PCI address> --set-timeslice <0-3>
//
// It sets the mock GPU's time slice through the inbox of the mock whose
// driver root it was started from (somewhere under <mock dir>), as the
// real tool changes the driver's state from outside the agent.
func smi(args []string) int {
	id, slice, err := parseSMI(args)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = fault.InjectDir(ctx, mockDir(os.Args[0]), fault.Fault{Kind: fault.TimeSlice, GPU: id, TimeSlice: slice})
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nvidia-smi (hwdra mock): %v\n", err)
		return 1
	}
	fmt.Printf("Set the compute time slice of GPU %s to %d.\n", id, slice)
	return 0
}

func parseSMI(args []string) (id string, slice int, err error) {
	usage := fmt.Errorf("usage: nvidia-smi compute-policy -i ID --set-timeslice 0|1|2|3 (the only command of the mock), not %q", strings.Join(args, " "))
	if len(args) == 0 || args[0] != "compute-policy" {
		return "", 0, usage
	}
	slice = -1
	for i := 1; i < len(args); i++ {
		name, value, inline := strings.Cut(args[i], "=")
		if !inline {
			if i+1 >= len(args) {
				return "", 0, usage
			}
			i++
			value = args[i]
		}
		switch name {
		case "-i", "--id":
			id = value
		case "--set-timeslice":
			if slice, err = strconv.Atoi(value); err != nil {
				return "", 0, usage
			}
		default:
			return "", 0, usage
		}
	}
	if id == "" || slice < 0 {
		return "", 0, usage
	}
	return id, slice, nil
}

// mockDir is the mock's directory of a program in its driver root: the
// nearest folder above it that holds the mock's fault inbox (the driver
// root's depth depends on where the profile installs the driver).
func mockDir(program string) string {
	abs, _ := filepath.Abs(program)
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		if st, err := os.Stat(filepath.Join(dir, fault.InboxDir)); err == nil && st.IsDir() {
			return dir
		}
		if dir == filepath.Dir(dir) {
			return filepath.Dir(abs) // no mock: InjectDir says so
		}
	}
}
