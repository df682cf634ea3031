package broker

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestAClientsErrorsAreLoggedAtWarnAndTheBrokersOwnAtError(t *testing.T) {
	tests := []struct {
		name, format string
		args         []any
		want         string
	}{
		{"a permissions violation", "%s - cid:%d - %s", []any{"127.0.0.1:53412", 7, `"v1.55.0:go" - Publish Violation - User "u", Subject "x"`}, "level=WARN"},
		{"a websocket client's", "%s - wid:%d - %s", []any{"127.0.0.1:1", 3, "authentication error"}, "level=WARN"},
		{"a refused authorization", "%s - cid:%d - %s", []any{"[::1]:1", 12, "authorization error - auth callout: the bearer is refused"}, "level=WARN"},
		{"the broker's own", "Error starting JetStream: %v", []any{"no space left on device"}, "level=ERROR"},
		{"a route's", "%s - rid:%d - %s", []any{"127.0.0.1:6222", 4, "route error"}, "level=ERROR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			logAdapter{l: slog.New(slog.NewTextHandler(&buf, nil))}.Errorf(tt.format, tt.args...)
			if !strings.Contains(buf.String(), tt.want) {
				t.Errorf("got %q, want %s", buf.String(), tt.want)
			}
		})
	}
}
