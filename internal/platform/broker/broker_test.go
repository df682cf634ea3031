package broker

import "testing"

func TestRedactURLHidesUserInformationOnly(t *testing.T) {
	tests := []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://alice:hunter2@n1:4222", "nats://REDACTED@n1:4222"},
		{"nats://s3cr3t-token@n1:4222", "nats://REDACTED@n1:4222"},
		{"nats://a:b@n1:4222,nats://n2:4222,tls://c:d@n3:4222/x?y=@z", "nats://REDACTED@n1:4222,nats://n2:4222,tls://REDACTED@n3:4222/x?y=@z"},
		{"user:p@ss@host:4222", "REDACTED@host:4222"},
		{"not a url: p@ss w0rd@", "REDACTED@"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := RedactURL(tt.in); got != tt.want {
			t.Errorf("RedactURL(%q): got %q, want %q", tt.in, got, tt.want)
		}
	}
}
