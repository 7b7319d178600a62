package storage_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/skein-ai/skein/storage"
	"github.com/skein-ai/skein/storage/storagetest"
)

// One adapter state save as the gateway makes it: its files (a 16 MB safetensors, as a rank-16
// adapter of a 0.5B model with Adam moments, and two small JSON files) uploaded as a new version,
// then the pointer swapped; and the load that copies it back. Run on both backends:
//
//	GOEXPERIMENT=simd go test ./storage -run '^$' -bench StateVersion -benchtime 20x
//	(with SKEIN_TEST_S3 and AWS credentials for the S3 rows)
func BenchmarkStateVersion(b *testing.B) {
	src := b.TempDir()
	big := make([]byte, 16<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	for name, body := range map[string][]byte{"adapter_model.safetensors": big, "adapter_config.json": []byte(`{"r":16}`), "trainer_state.json": []byte(`{"step":1}`)} {
		if err := os.WriteFile(filepath.Join(src, name), body, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	for name, open := range map[string]func(testing.TB) storage.Storage{
		"dir": func(tb testing.TB) storage.Storage {
			d, err := storage.NewDir(tb.TempDir())
			if err != nil {
				tb.Fatal(err)
			}
			return d
		},
		"s3": func(tb testing.TB) storage.Storage { return storagetest.S3(tb) },
	} {
		b.Run(name+"/save", func(b *testing.B) {
			st := open(b)
			ctx := context.Background()
			fence := ""
			b.SetBytes(int64(len(big)))
			for i := range b.N {
				v := fmt.Sprintf("run@%d", i)
				if _, err := storage.PutTree(ctx, st, "state/"+v, src); err != nil {
					b.Fatal(err)
				}
				var err error
				if fence, err = storage.SwapPointer(ctx, st, "state/run.current", v, fence); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/load", func(b *testing.B) {
			st := open(b)
			ctx := context.Background()
			if _, err := storage.PutTree(ctx, st, "state/run@1", src); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(big)))
			for range b.N {
				dst := filepath.Join(b.TempDir(), "x")
				if err := storage.GetTree(ctx, st, "state/run@1", dst, 1<<30); err != nil {
					b.Fatal(err)
				}
				os.RemoveAll(dst)
			}
		})
	}
}
