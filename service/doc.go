// Package service wires the authority plane: configuration, the space material, the embedded
// broker or an existing cluster, the plane's own connections and stores, the micro service and
// the HTTP face, and the plane's instance fence.
package service
