// ggml_quant_fixture writes the blocks ggml's own reference quantizers make of fixed inputs, as
// JSON, for engine/internal/quant's bit-exactness tests. It loads libggml-base.so at run time
// (from the npm package @node-llama-cpp/linux-x64; nothing of ggml is committed):
//
//	NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --prefix /tmp/ggml @node-llama-cpp/linux-x64@3.22.1
//	gcc -O1 -o /tmp/qfix scripts/ggml_quant_fixture.c -ldl
//	/tmp/qfix /tmp/ggml/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so \
//	    > engine/internal/quant/testdata/ggml_blocks.json
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*quant_fn)(const float *x, void *y, int64_t k);

static uint32_t rng = 12345;
static float next_normal(void) { // deterministic, portable: sum of uniforms
	float s = 0;
	for (int i = 0; i < 12; i++) {
		rng = rng * 1664525u + 1013904223u;
		s += (float)(rng >> 8) / 16777216.0f;
	}
	return s - 6.0f;
}

// fill makes the inputs: a row of normals, a block of zeros, a row with exact .5 ties of the
// scale, tiny values, huge values, one outlier per block.
static void fill(float *x, int n, int kind) {
	for (int i = 0; i < n; i++) {
		switch (kind) {
		case 0: x[i] = 0.02f * next_normal(); break;
		case 1: x[i] = (i < 32) ? 0.0f : 0.02f * next_normal(); break;
		case 2: x[i] = ((i % 32) == 0) ? 127.0f : (float)((i % 17) - 8) + 0.5f; break;
		case 3: x[i] = 1e-30f * next_normal(); break;
		case 4: x[i] = 6e4f * next_normal(); break;
		default: x[i] = ((i % 32) == 5) ? 3.0f : 0.001f * next_normal(); break;
		}
	}
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
	struct { const char *name, *sym; int block, bytes; } types[] = {
		{"q8_0", "quantize_row_q8_0_ref", 32, 34},
		{"q4_k", "quantize_row_q4_K_ref", 256, 144},
		{"q6_k", "quantize_row_q6_K_ref", 256, 210},
	};
	enum { N = 512 };
	float x[N];
	uint8_t y[N / 256 * 210 + N / 32 * 34];
	printf("{");
	for (int t = 0; t < (int)(sizeof types / sizeof types[0]); t++) {
		quant_fn f = (quant_fn)dlsym(lib, types[t].sym);
		if (!f) {
			fprintf(stderr, "%s\n", dlerror());
			return 1;
		}
		printf("%s\"%s\": [", t ? ", " : "", types[t].name);
		for (int kind = 0; kind < 6; kind++) {
			fill(x, N, kind);
			memset(y, 0, sizeof y);
			f(x, y, N);
			printf("%s{\"x\": ", kind ? ", " : "");
			hex((const uint8_t *)x, sizeof x);
			printf(", \"blocks\": ");
			hex(y, N / types[t].block * types[t].bytes);
			printf("}");
		}
		printf("]");
	}
	printf("}\n");
	return 0;
}
