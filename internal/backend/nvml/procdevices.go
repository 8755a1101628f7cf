// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CharDriverMajor is a character driver's major number from
// <procRoot>/devices: nvidia-uvm's and nvidia-caps' are dynamic (238 and
// 241 on the real H200 measured, 510 in the mock), so device nodes are
// named from it, never from a constant.
func CharDriverMajor(procRoot, driver string) (int64, error) {
	path := filepath.Join(procRoot, "devices")
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	char := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Character devices:":
			char = true
		case line == "Block devices:":
			char = false
		case char:
			if num, name, ok := strings.Cut(line, " "); ok && strings.TrimSpace(name) == driver {
				return strconv.ParseInt(num, 10, 64)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no character driver %q in %s", driver, path)
}
