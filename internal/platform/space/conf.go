package space

import (
	"fmt"
	"path/filepath"
	"strings"
)

// ServerConf renders a nats-server configuration for servers the plane does not run: operator
// mode, a full account resolver preloaded with the four accounts, and JetStream syncing every
// write to disk before acknowledging it (the plane refuses a server that does not). storeDir is
// where the server keeps its resolver and JetStream data; listen is its client address.
func (m *Keys) ServerConf(storeDir, listen string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# nats-server configuration for Cotal space %q, written by `authplane init`.\n", m.Space)
	b.WriteString("# Operator mode with a full account resolver; JetStream for the plane account only.\n\n")
	fmt.Fprintf(&b, "listen: %q\n\n", listen)
	fmt.Fprintf(&b, "operator: %q\n", m.OperatorJWT)
	fmt.Fprintf(&b, "system_account: %q\n\n", m.System.Public())
	b.WriteString("# sync_interval: always: every JetStream write is on disk before it is acknowledged, so an\n")
	b.WriteString("# OS crash or a power cut takes back nothing the plane acknowledged (docs/OPERATIONS.md).\n")
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n  sync_interval: always\n}\n\n", filepath.Join(storeDir, "jetstream"))
	fmt.Fprintf(&b, "resolver {\n  type: full\n  dir: %q\n  allow_delete: false\n  interval: \"2m\"\n}\n\n", filepath.Join(storeDir, "resolver"))
	b.WriteString("resolver_preload {\n")
	for _, a := range m.Accounts() {
		fmt.Fprintf(&b, "  # %s\n  %s: %q\n", a.Name, a.Public(), a.JWT)
	}
	b.WriteString("}\n")
	return b.String()
}
