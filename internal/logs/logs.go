// Package logs holds what the plane's log lines share beyond log/slog.
package logs

// Sparse reports whether the nth of a run of like events is logged: the 1st, 2nd, 4th, 8th…,
// so that no caller can flood the log with them, and the count each line carries says how
// many there were.
func Sparse[N ~int | ~int64 | ~uint64](n N) bool { return n > 0 && n&(n-1) == 0 }
