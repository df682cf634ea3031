package faces

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

// send sends a request as given: method, body (nil for none) and headers, nothing added.
func send(t testing.TB, method, url string, body []byte, headers ...string) harness.Reply {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	return harness.Do(t, req)
}

// refused fails the test unless r is a refusal with status and code whose body is exactly
// {error, code}: no bearer, no credential, nothing else.
func refused(t testing.TB, what string, r harness.Reply, status int, code string) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Errorf("%s: got %d %q, want a JSON refusal %d %s", what, r.Status, r.Body, status, code)
		return
	}
	_, hasError := m["error"]
	if r.Status != status || m["code"] != code || !hasError || len(m) != 2 {
		t.Errorf("%s: got %d %s, want %d {error, code: %s} and nothing else", what, r.Status, r.Body, status, code)
	}
}
