package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/subjects"
)

func TestHealthAnswersOnlyOnItsExactPath(t *testing.T) {
	t.Parallel()
	p := startPlane(t, nil)
	tests := []struct {
		name   string
		method string
		path   string
		status int
		code   string // the error code of a refusal; "" for the health answer
	}{
		{"GET", http.MethodGet, "/health", http.StatusOK, ""},
		{"HEAD", http.MethodHead, "/health", http.StatusOK, ""},
		{"POST", http.MethodPost, "/health", http.StatusMethodNotAllowed, "bad-request"},
		{"a trailing slash", http.MethodGet, "/health/", http.StatusNotFound, "not-found"},
		{"a query", http.MethodGet, "/health?x=1", http.StatusNotFound, "not-found"},
		{"another case", http.MethodGet, "/HEALTH", http.StatusNotFound, "not-found"},
		{"an escaped letter", http.MethodGet, "/%68ealth", http.StatusNotFound, "not-found"},
		{"a dot segment", http.MethodGet, "/x/../health", http.StatusNotFound, "not-found"},
		{"the root", http.MethodGet, "/", http.StatusNotFound, "not-found"},
		{"an unknown path", http.MethodGet, "/metrics/x", http.StatusNotFound, "not-found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, p.HTTPURL()+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Origin", "https://evil.example")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw := readBody(t, resp)
			if resp.StatusCode != tt.status {
				t.Errorf("%s %s: got status %d, want %d", tt.method, tt.path, resp.StatusCode, tt.status)
			}
			for name := range resp.Header {
				if strings.HasPrefix(strings.ToLower(name), "access-control-") {
					t.Errorf("%s %s: got header %s, want no CORS headers ever", tt.method, tt.path, name)
				}
			}
			if tt.method == http.MethodHead {
				return
			}
			var got map[string]any
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatalf("%s %s: body %q: %v", tt.method, tt.path, raw, err)
			}
			if tt.code == "" {
				if want := map[string]any{"ok": true, "issuer": subjects.Issuer(testSpace)}; !reflect.DeepEqual(got, want) {
					t.Errorf("%s %s: got %s, want %v", tt.method, tt.path, raw, want)
				}
				return
			}
			if got["code"] != tt.code || got["error"] == nil || len(got) != 2 {
				t.Errorf("%s %s: got %s, want {\"error\": message, \"code\": %q}", tt.method, tt.path, raw, tt.code)
			}
		})
	}
}

// readBody reads and closes an HTTP response's body.
func readBody(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	raw, err := io.ReadAll(resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
