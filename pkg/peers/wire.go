package peers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Path is where a replica serves its log, on its metrics port.
const Path = "/peer/commits"

// InstanceHeader carries the polling replica's own log instance (hex) on every poll: for the
// logs and proxies in between (the replay's pacing), not needed by the log.
const InstanceHeader = "X-Kvpick-Peer-Instance"

// MaxWait bounds how long a poll waits for a new entry (GET Path?since=N&wait=MS), so that a
// shutting-down server's open polls end soon.
const MaxWait = time.Second

// Handler serves the log: GET Path?since=N[&wait=MS]. With wait, a poll that finds no entry
// from since on waits up to MS milliseconds (at most MaxWait) for one, so an entry reaches
// a waiting peer one round trip after it is published.
func (l *Log) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		var since uint64
		if s := r.URL.Query().Get("since"); s != "" {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				http.Error(w, "since: not a sequence number", http.StatusBadRequest)
				return
			}
			since = v
		}
		if s := r.URL.Query().Get("wait"); s != "" {
			ms, err := strconv.ParseUint(s, 10, 32)
			if err != nil {
				http.Error(w, "wait: not a number of milliseconds", http.StatusBadRequest)
				return
			}
			if ms > 0 {
				t := time.NewTimer(min(time.Duration(ms)*time.Millisecond, MaxWait))
				select {
				case <-l.waitFor(since):
				case <-t.C:
				case <-r.Context().Done():
				}
				t.Stop()
			}
		}
		b := l.appendAnswer(make([]byte, 0, 4096), since)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		_, _ = w.Write(b)
	})
}

// answer is a decoded poll answer.
type answer struct {
	instance, next, first uint64
	entries               []entry
}

var errShort = errors.New("truncated")

// Head reads an answer's header: the log's instance and the number its next entry will get
// (a poll with a since beyond every entry is answered with the header alone).
func Head(b []byte) (instance, next uint64, err error) {
	if len(b) < headerBytes || string(b[:4]) != magic {
		return 0, 0, errors.New("not a peer commit log answer")
	}
	if b[4] != version {
		return 0, 0, fmt.Errorf("version %d, want %d", b[4], version)
	}
	return binary.LittleEndian.Uint64(b[5:]), binary.LittleEndian.Uint64(b[13:]), nil
}

// decode parses an answer. It checks every length against the bytes there are, so garbage
// gives an error, never a panic or a huge allocation.
func decode(b []byte) (*answer, error) {
	instance, next, err := Head(b)
	if err != nil {
		return nil, err
	}
	a := &answer{instance: instance, next: next, first: binary.LittleEndian.Uint64(b[21:])}
	count := binary.LittleEndian.Uint32(b[29:])
	b = b[headerBytes:]
	// Each entry takes at least 22 bytes: a count beyond that is a lie.
	if uint64(count) > uint64(len(b)/22) {
		return nil, fmt.Errorf("%d entries in %d bytes: %w", count, len(b), errShort)
	}
	a.entries = make([]entry, 0, count)
	prev := uint64(0)
	for i := range count {
		if len(b) < 18 {
			return nil, errShort
		}
		seq := binary.LittleEndian.Uint64(b)
		if i > 0 && seq <= prev {
			return nil, fmt.Errorf("entry %d: sequence %d after %d", i, seq, prev)
		}
		prev = seq
		kind, id := b[8], binary.LittleEndian.Uint64(b[9:])
		if kind < KindPick || kind > KindDrop {
			return nil, fmt.Errorf("entry %d: kind %d", i, kind)
		}
		n := int(b[17])
		b = b[18:]
		if len(b) < n+4 {
			return nil, errShort
		}
		addr := string(b[:n])
		blocks := binary.LittleEndian.Uint32(b[n:])
		b = b[n+4:]
		if kind == KindDrop && (n != 0 || blocks != 0) {
			return nil, fmt.Errorf("entry %d: a drop with an address or blocks", i)
		}
		if (kind != KindDrop && blocks == 0) || blocks > maxEntryBlocks || uint64(blocks)*8 > uint64(len(b)) {
			return nil, fmt.Errorf("entry %d: %d blocks in %d bytes: %w", i, blocks, len(b), errShort)
		}
		var hashes []uint64
		if blocks > 0 {
			hashes = make([]uint64, blocks)
		}
		for k := range hashes {
			hashes[k] = binary.LittleEndian.Uint64(b[8*k:])
		}
		b = b[8*int(blocks):]
		a.entries = append(a.entries, entry{seq: seq, kind: kind, id: id, addr: addr, hashes: hashes})
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%d bytes after the last entry", len(b))
	}
	return a, nil
}
