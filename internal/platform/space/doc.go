// Package space owns the space material: the operator, the four accounts docs/OPERATIONS.md names ("What it runs") and their
// keys, the callout's fixed user and xkey, the owner secret and the first bearer issuer key.
// It is written once, atomically, and only read afterwards; files.go and git.go write the
// plane's files safely and keep its secrets out of git.
package space
