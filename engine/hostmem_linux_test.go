package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/skein-ai/skein/safetensors"
)

// A mapped weight file loads the model a read one does, and giving back a converted tensor's
// pages neither changes what the mapping reads (the pages come back from the file) nor touches
// heap bytes.
func TestMappedWeightsLoadAsRead(t *testing.T) {
	ids := []int{5, 9, 14, 3, 77, 21, 8}
	var lps [2][][]float64
	for k, from := range []int64{1 << 62, 0} {
		old := mapFrom
		mapFrom = from
		e, err := Load(tinyModel(t, ArchLlama), Options{})
		mapFrom = old
		if err != nil {
			t.Fatal(err)
		}
		r, err := e.Forward(context.Background(), "", []Datum{textDatum(ids)}, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		lps[k] = r.Logprobs
	}
	if !reflect.DeepEqual(lps[0], lps[1]) {
		t.Fatalf("logprobs read %v, mapped %v", lps[0], lps[1])
	}
	path := filepath.Join(t.TempDir(), "f")
	want := make([]byte, 5*os.Getpagesize()+123)
	for i := range want {
		want[i] = byte(i*7 + 1)
	}
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	b, ok := mapFile(path)
	if !ok {
		t.Fatal("mapFile failed")
	}
	if !reflect.DeepEqual(b, want) {
		t.Fatal("mapped bytes differ from the file")
	}
	releaseHost(b[100:])
	if !reflect.DeepEqual(b, want) {
		t.Fatal("after releaseHost the mapping reads other bytes")
	}
	heap := append([]byte(nil), want...)
	releaseHost(heap)
	if !reflect.DeepEqual(heap, want) {
		t.Fatal("releaseHost changed heap bytes")
	}
}

// Quantizing a mapped tensor at load gives back its rows' pages as each chunk is converted, so
// that a big tensor (an 8B head: 1.05 GB of bf16 file) is not resident whole beside the model
// while it is quantized; the blocks are those of quantizing the tensor in one piece.
func TestQuantizingAMappedTensorGivesBackItsPages(t *testing.T) {
	rows, n := 256, 4096
	raw := make([]byte, rows*n*2)
	for i := range rows * n {
		v := float32(math.Sin(float64(i)*0.37)) * 0.05
		binary.LittleEndian.PutUint16(raw[2*i:], uint16(math.Float32bits(v)>>16))
	}
	path := filepath.Join(t.TempDir(), "w")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	b, ok := mapFile(path)
	if !ok {
		t.Fatal("mapFile failed")
	}
	tensor := safetensors.Tensor{DType: "BF16", Shape: []int{rows, n}, Data: b}
	sum := 0
	for _, v := range b { // every page resident
		sum += int(v)
	}
	before := mappedRSS(t, b)
	if before < len(b)/2 {
		t.Fatalf("only %d of %d bytes resident after reading them all (sum %d)", before, len(b), sum)
	}
	qf := quantFormat(PrecisionQ8_0)
	got, err := quantizeHost(qf, tensor)
	if err != nil {
		t.Fatal(err)
	}
	if after := mappedRSS(t, b); after > len(b)/8 {
		t.Errorf("%d of the tensor's %d bytes still resident after quantizing it (%d before)", after, len(b), before)
	}
	f, err := tensor.Float32()
	if err != nil {
		t.Fatal(err)
	}
	want, err := qf.Quantize(f, n)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("blocks differ from quantizing the tensor whole")
	}
}

// mappedRSS is the resident bytes of the mapping holding b (/proc/self/smaps).
func mappedRSS(t *testing.T, b []byte) int {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Skip("no /proc/self/smaps")
	}
	start := uint64(uintptr(unsafe.Pointer(&b[0])))
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		var lo, hi uint64
		if n, _ := fmt.Sscanf(line, "%x-%x", &lo, &hi); n == 2 && strings.Contains(line, " ") && !strings.HasPrefix(line, "Rss") {
			in = lo <= start && start < hi
			continue
		}
		if kb, ok := strings.CutPrefix(line, "Rss:"); ok && in {
			var v int
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(kb), " kB"), &v)
			return v << 10
		}
	}
	t.Fatal("mapping not found in /proc/self/smaps")
	return 0
}
