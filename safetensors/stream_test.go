package safetensors

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// A streamed file reads back as the tensors it was given, in any order of offsets; a tensor
// given the wrong number of bytes is an error and leaves no file.
func TestWriteStreamRoundTrips(t *testing.T) {
	a := FromFloat32([]float32{1, -2, 3.5, 4, 5, 6}, 2, 3)
	b := FromFloat64([]float64{0.25, 7}, 2)
	ts := []Tensor{a, b}
	specs := []Spec{{"z.first", "F32", []int{2, 3}}, {"a.second", "F64", []int{2}}}
	path := filepath.Join(t.TempDir(), "m.safetensors")
	err := WriteStream(path, specs, map[string]string{"format": "pt"}, func(i int, w io.Writer) error {
		_, err := w.Write(ts[i].Data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["format"] != "pt" || len(f.Tensors) != 2 {
		t.Fatalf("metadata %v, %d tensors", f.Metadata, len(f.Tensors))
	}
	for i, s := range specs {
		got := f.Tensors[s.Name]
		if got.DType != ts[i].DType || !reflect.DeepEqual(got.Shape, ts[i].Shape) || !reflect.DeepEqual(got.Data, ts[i].Data) {
			t.Fatalf("%s: read %v %v, wrote %v %v", s.Name, got.DType, got.Shape, ts[i].DType, ts[i].Shape)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	err = WriteStream(bad, specs, nil, func(i int, w io.Writer) error {
		_, err := w.Write(ts[i].Data[:4])
		return err
	})
	if !errors.Is(err, ErrFormat) {
		t.Fatalf("a short tensor: %v, want ErrFormat", err)
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Fatalf("a failed write left %s (%v)", bad, err)
	}
	if _, err := os.Stat(bad + ".tmp"); !os.IsNotExist(err) {
		t.Fatal("a failed write left its temp file")
	}
}
