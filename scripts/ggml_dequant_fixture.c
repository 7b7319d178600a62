// ggml_dequant_fixture writes blocks of the GGUF types skein only reads (Q6_K, Q4_0), made by
// ggml's reference quantizers, with ggml's own dequantization of them, as JSON, for engine/gguf's
// bit-exactness test. It loads libggml-base.so at run time (npm @node-llama-cpp/linux-x64;
// nothing of ggml is committed):
//
//	npm install --prefix /tmp/ggml @node-llama-cpp/linux-x64
//	gcc -O1 -o /tmp/dqfix scripts/ggml_dequant_fixture.c -ldl
//	/tmp/dqfix /tmp/ggml/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so \
//	    > engine/gguf/testdata/ggml_dequant.json
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*quant_fn)(const float *x, void *y, int64_t k);
typedef void (*dequant_fn)(const void *x, float *y, int64_t k);

static uint32_t rng = 777;
static float next_normal(void) {
	float s = 0;
	for (int i = 0; i < 12; i++) {
		rng = rng * 1664525u + 1013904223u;
		s += (float)(rng >> 8) / 16777216.0f;
	}
	return s - 6.0f;
}

static void hex(const uint8_t *b, int n) {
	putchar('"');
	for (int i = 0; i < n; i++) printf("%02x", b[i]);
	putchar('"');
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: %s libggml-base.so\n", argv[0]);
		return 2;
	}
	void *lib = dlopen(argv[1], RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	struct { const char *name, *q, *dq; int block, bytes; } types[] = {
		{"q6_k", "quantize_row_q6_K_ref", "dequantize_row_q6_K", 256, 210},
		{"q4_0", "quantize_row_q4_0_ref", "dequantize_row_q4_0", 32, 18},
	};
	enum { N = 1024 };
	float x[N], y[N];
	uint8_t blocks[N / 32 * 34];
	printf("{");
	for (int t = 0; t < 2; t++) {
		quant_fn q = (quant_fn)dlsym(lib, types[t].q);
		dequant_fn dq = (dequant_fn)dlsym(lib, types[t].dq);
		if (!q || !dq) {
			fprintf(stderr, "%s\n", dlerror());
			return 1;
		}
		printf("%s\"%s\": [", t ? ", " : "", types[t].name);
		for (int kind = 0; kind < 3; kind++) {
			for (int i = 0; i < N; i++) {
				float v = next_normal();
				x[i] = kind == 0 ? 0.02f * v : kind == 1 ? 50.0f * v : ((i % 97) == 3 ? 4.0f : 0.001f * v);
			}
			q(x, blocks, N);
			dq(blocks, y, N);
			printf("%s{\"blocks\": ", kind ? ", " : "");
			hex(blocks, N / types[t].block * types[t].bytes);
			printf(", \"values\": ");
			hex((const uint8_t *)y, sizeof y);
			printf("}");
		}
		printf("]");
	}
	printf("}\n");
	return 0;
}
