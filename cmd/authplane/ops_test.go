package main

import (
	"runtime/debug"
	"testing"

	"github.com/cotal-ai/authplane/service"
)

func TestVersionTextNamesTheModuleVersionAndTheRevision(t *testing.T) {
	tests := []struct {
		name    string
		bi      *debug.BuildInfo
		stamped string
		want    string
	}{
		{"a tagged build from a clean tree", &debug.BuildInfo{
			Main:     debug.Module{Path: "github.com/cotal-ai/authplane", Version: "v0.1.0"},
			Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.modified", Value: "false"}},
		}, "", "authplane " + service.Version + "\n  module   v0.1.0\n  revision 0123abcd\n"},
		{"a modified tree", &debug.BuildInfo{
			Main:     debug.Module{Version: "v0.0.0-20260101000000-0123abcd+dirty"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.modified", Value: "true"}},
		}, "", "authplane " + service.Version + "\n  module   v0.0.0-20260101000000-0123abcd+dirty\n  revision 0123abcd\n  (built from a tree with uncommitted changes)\n"},
		{"no VCS stamp", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "",
			"authplane " + service.Version + "\n  module   (devel)\n  revision unknown\n"},
		{"no VCS, the revision the build was told (an image)", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "fedcba98",
			"authplane " + service.Version + "\n  module   (devel)\n  revision fedcba98\n"},
		{"the toolchain's VCS revision over a stamp", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abcd"}}}, "fedcba98",
			"authplane " + service.Version + "\n  module   \n  revision 0123abcd\n"},
		{"no build info", nil, "", "authplane " + service.Version + "\n  module   unknown\n  revision unknown\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := versionText(tt.bi, tt.stamped); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
