package extproc

import "testing"

func TestBufferClassesNeverHandOutTooSmallABuffer(t *testing.T) {
	s := &Server{}
	for _, c := range []int{16 << 10, 20 << 10, 64 << 10, 100 << 10, 256 << 10, 1 << 20} {
		s.putBuf(make([]byte, 0, c))
	}
	for _, want := range []int{0, 1, 16 << 10, 16<<10 + 1, 64 << 10, 200 << 10, 1 << 20} {
		b := s.getBuf(itoa(want), 32<<20)
		if cap(b) < want || len(b) != 0 {
			t.Fatalf("getBuf(%d): len %d cap %d", want, len(b), cap(b))
		}
		if want <= 16<<10 && cap(b) > 64<<10 {
			t.Fatalf("a %d-byte body got a %d-byte buffer", want, cap(b))
		}
	}
	if b := s.getBuf(itoa(3<<20), 32<<20); cap(b) < 3<<20 {
		t.Fatalf("large body: cap %d", cap(b))
	}
	if b := s.getBuf("garbage", 32<<20); cap(b) < 16<<10 {
		t.Fatalf("no content-length: cap %d", cap(b))
	}
}

func itoa(n int) string {
	if n == 0 {
		return ""
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
