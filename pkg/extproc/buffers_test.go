package extproc

import (
	"strconv"
	"testing"
)

func TestBufferClassesHoldTheBytesWithinFourTimes(t *testing.T) {
	s := &Server{}
	for _, c := range []int{16 << 10, 64 << 10, 256 << 10, 1 << 20} {
		s.putBuf(make([]byte, 0, c))
	}
	for _, n := range []int{0, 1, 16 << 10, 16<<10 + 1, 64 << 10, 200 << 10, 1 << 20} {
		b := s.classBuf(n)
		if cap(b) < n || len(b) != 0 {
			t.Fatalf("classBuf(%d): len %d cap %d", n, len(b), cap(b))
		}
		if cap(b) > max(16<<10, 4*n) {
			t.Fatalf("a %d-byte body got a %d-byte buffer", n, cap(b))
		}
	}
}

func TestPreSizeIsCappedWhateverTheClientAnnounces(t *testing.T) {
	s := &Server{}
	tests := []struct {
		contentLength string
		wantCap       int
	}{
		{"", 16 << 10},
		{"garbage", 16 << 10},
		{"-5", 16 << 10},
		{"2000", 16 << 10},
		{strconv.Itoa(50 << 10), 64 << 10},
		{strconv.Itoa(32 << 20), 64 << 10},
		{"99999999999999999999", 16 << 10}, // does not parse as int64
	}
	for _, tc := range tests {
		if b := s.getBuf(tc.contentLength); cap(b) != tc.wantCap || len(b) != 0 {
			t.Errorf("getBuf(%q): len %d cap %d, want cap %d", tc.contentLength, len(b), cap(b), tc.wantCap)
		}
	}
}

func TestAppendBodyKeepsTheBytesAndStopsAtTheLimit(t *testing.T) {
	s := &Server{}
	var want []byte
	buf := s.getBuf("")
	chunk := make([]byte, 100<<10)
	for i := range 30 { // 3 MiB: past the pooled classes
		for j := range chunk {
			chunk[j] = byte(i + j)
		}
		buf = s.appendBody(buf, chunk, 3000<<10)
		want = append(want, chunk...)
	}
	if string(buf) != string(want) {
		t.Fatal("bytes lost or reordered while growing")
	}
	if cap(buf) > 3000<<10 {
		t.Fatalf("grew to %d bytes, past the 3000 KiB limit", cap(buf))
	}
}

func TestBuffersBetweenClassesAreFiledUnderTheClassTheyCover(t *testing.T) {
	s := &Server{}
	s.putBuf(make([]byte, 0, 20<<10))  // covers the 16 KiB class
	s.putBuf(make([]byte, 0, 100<<10)) // covers the 64 KiB class
	for _, n := range []int{16 << 10, 64 << 10} {
		if b := s.classBuf(n); cap(b) < n {
			t.Fatalf("classBuf(%d) handed out %d bytes", n, cap(b))
		}
	}
}
