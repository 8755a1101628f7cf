// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package manifestfiles lists the files a command's manifest arguments
// name, as kubectl -f takes them (hwdra lab --claim, hwdra convert -f).
package manifestfiles

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Stdin is the argument that names standard input.
const Stdin = "-"

// Expand replaces each directory by its .yaml, .yml and .json files (not
// its subdirectories'), in name order; files and Stdin stay as given.
// Standard input may be named once.
func Expand(paths []string) ([]string, error) {
	var files []string
	stdin := false
	for _, p := range paths {
		if p == Stdin {
			if stdin {
				return nil, errors.New("standard input given twice")
			}
			stdin = true
			files = append(files, p)
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		n := len(files)
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
				files = append(files, filepath.Join(p, e.Name()))
			}
		}
		if len(files) == n {
			return nil, fmt.Errorf("%s: no .yaml, .yml or .json file in the directory", p)
		}
	}
	return files, nil
}
