package logs

import "testing"

func TestSparseLogsThePowersOfTwo(t *testing.T) {
	var got []int
	for n := -1; n <= 64; n++ {
		if Sparse(n) {
			got = append(got, n)
		}
	}
	want := []int{1, 2, 4, 8, 16, 32, 64}
	if len(got) != len(want) {
		t.Fatalf("logged %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logged %v, want %v", got, want)
		}
	}
	if !Sparse(uint64(1)<<63) || Sparse(uint64(0)) {
		t.Fatal("Sparse on uint64: want 2^63 logged and 0 not")
	}
}
