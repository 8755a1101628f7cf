// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"strings"
	"testing"
)

// TestMetricsAddress: --metrics-bind-address (the node's IP, from the
// chart) takes the place of --metrics-address's empty host, IPv6 too;
// anything else is refused naming the flag.
func TestMetricsAddress(t *testing.T) {
	for _, tc := range []struct{ addr, bind, want, err string }{
		{":9464", "", ":9464", ""},
		{"127.0.0.1:9464", "", "127.0.0.1:9464", ""},
		{":9464", "10.0.0.7", "10.0.0.7:9464", ""},
		{":9464", "fd00::7", "[fd00::7]:9464", ""},
		{"", "10.0.0.7", "", ""},
		{":9464", "node-1", "", "--metrics-bind-address \"node-1\": not an IP address"},
		{"0.0.0.0:9464", "10.0.0.7", "", "both name a host"},
		{"9464", "10.0.0.7", "", "--metrics-address \"9464\""},
	} {
		got, err := metricsAddress(tc.addr, tc.bind)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("metricsAddress(%q, %q) = %q, %v; want %q, %q", tc.addr, tc.bind, got, err, tc.want, tc.err)
		}
	}
}
