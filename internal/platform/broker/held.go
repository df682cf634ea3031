package broker

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cotal-ai/authplane/subjects"
)

// Held returns, by server name, the account JWT each of the cluster's n servers applies (what
// it holds in memory, not only what its resolver stored), or what answered before ctx ended: a
// server missing from the map did not answer. It fails only when none did.
func (a Account) Held(ctx context.Context, n int) (map[string]string, error) {
	held := map[string]string{}
	err := ask(ctx, a.NC, subjects.AccountInfo(a.Public), nil, func(data []byte) (bool, error) {
		var resp struct {
			Server struct {
				Name string `json:"name"`
			} `json:"server"`
			Data *struct {
				JWT string `json:"jwt"`
			} `json:"data"`
		}
		if json.Unmarshal(data, &resp) == nil && resp.Server.Name != "" && resp.Data != nil {
			held[resp.Server.Name] = resp.Data.JWT
		}
		return len(held) >= n, nil
	})
	if err != nil && len(held) == 0 {
		return nil, fmt.Errorf("read account %s from the servers: %w", a.Public, err)
	}
	return held, nil
}
