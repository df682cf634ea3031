// Package service is the running plane: configuration, the space material, the embedded
// broker or an existing cluster, the plane's own connections and stores, the micro services and
// the HTTP face, and the plane's instance fence. Start builds it; Close tears it down in reverse.
package service
