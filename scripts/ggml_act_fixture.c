// ggml_act_fixture writes, as JSON, how ggml-cpu's x86 AVX2 build (the haswell variant that
// node-llama-cpp's prebuilt loads on an AVX2 machine) rounds activations for its quantized
// products (from_float of Q8_0 and Q8_K: quantize_row_q8_0, quantize_row_q8_K) and the dot
// products it takes of them with Q8_0, Q4_K and Q6_K weight rows (the vec_dot of each type),
// for engine/internal/quant's bit-exactness tests. It loads the libraries at run time (from the
// npm package @node-llama-cpp/linux-x64; nothing of ggml is committed):
//
//	NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --prefix /tmp/llamacpp @node-llama-cpp/linux-x64@3.22.1
//	gcc -O1 -o /tmp/actfix scripts/ggml_act_fixture.c -ldl
//	B=/tmp/llamacpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
//	LD_LIBRARY_PATH=$B /tmp/actfix $B > engine/internal/quant/testdata/ggml_act.json
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*quant_fn)(const float *x, void *y, int64_t k);
typedef void (*dot_fn)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc);
struct traits { quant_fn from_float; dot_fn vec_dot; int vec_dot_type; int64_t nrows; };
typedef const struct traits *(*traits_fn)(int type);

enum { T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14, T_Q8_K = 15 };
enum { N = 512, ACTS = 9, ROWS = 4 };

static uint32_t rng = 777;
static float next_normal(void) { // deterministic, portable: sum of uniforms
	float s = 0;
	for (int i = 0; i < 12; i++) {
		rng = rng * 1664525u + 1013904223u;
		s += (float)(rng >> 8) / 16777216.0f;
	}
	return s - 6.0f;
}

// fill makes the activations: normals of two sizes, a zero super-block, exact .5 ties of the
// scale (127 the maximum, so 127/amax = 1), tiny and huge values, one outlier per 32, +max and
// −max both present (−max first), and a row with a single nonzero.
static void fill(float *x, int kind) {
	for (int i = 0; i < N; i++) {
		switch (kind) {
		case 0: x[i] = next_normal(); break;
		case 1: x[i] = 0.05f * next_normal(); break;
		case 2: x[i] = (i < 256) ? 0.0f : next_normal(); break;
		case 3: x[i] = ((i % 32) == 0) ? 127.0f : (float)((i % 17) - 8) + 0.5f; break;
		case 4: x[i] = 1e-30f * next_normal(); break;
		case 5: x[i] = 6e4f * next_normal(); break;
		case 6: x[i] = ((i % 32) == 5) ? 30.0f : 0.01f * next_normal(); break;
		case 7: x[i] = (i % 64 == 3) ? -4.0f : (i % 64 == 9) ? 4.0f : next_normal(); break;
		default: x[i] = (i == 300) ? -2.5f : 0.0f; break;
		}
	}
}

static void hex(const void *p, int n) {
	const uint8_t *b = p;
	putchar('"');
	for (int i = 0; i < n; i++) printf("%02x", b[i]);
	putchar('"');
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: %s BINS_DIR (holding libggml-base.so and libggml-cpu-haswell.so)\n", argv[0]);
		return 2;
	}
	char path[4096];
	snprintf(path, sizeof path, "%s/libggml-base.so", argv[1]);
	void *base = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	snprintf(path, sizeof path, "%s/libggml-cpu-haswell.so", argv[1]);
	void *cpu = base ? dlopen(path, RTLD_NOW) : NULL;
	if (!cpu) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	void (*cpu_init)(void) = (void (*)(void))dlsym(cpu, "ggml_cpu_init");
	traits_fn traits = (traits_fn)dlsym(cpu, "ggml_get_type_traits_cpu");
	if (!cpu_init || !traits) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	cpu_init();
	static float acts[ACTS][N];
	static uint8_t q80[ACTS][N / 32 * 34], q8k[ACTS][N / 256 * 292];
	for (int a = 0; a < ACTS; a++) {
		fill(acts[a], a);
		traits(T_Q8_0)->from_float(acts[a], q80[a], N);
		traits(T_Q8_K)->from_float(acts[a], q8k[a], N);
	}
	printf("{\"n\": %d, \"acts\": [", N);
	for (int a = 0; a < ACTS; a++) {
		printf(a ? ", " : "");
		hex(acts[a], sizeof acts[a]);
	}
	printf("], \"q8_0\": [");
	for (int a = 0; a < ACTS; a++) {
		printf(a ? ", " : "");
		hex(q80[a], sizeof q80[a]);
	}
	printf("], \"q8_k\": [");
	for (int a = 0; a < ACTS; a++) {
		printf(a ? ", " : "");
		hex(q8k[a], sizeof q8k[a]);
	}
	printf("], \"weights\": [");
	struct { const char *name, *ref; int type, block, bytes; } wt[] = {
		{"q8_0", "quantize_row_q8_0_ref", T_Q8_0, 32, 34},
		{"q4_k", "quantize_row_q4_K_ref", T_Q4_K, 256, 144},
		{"q6_k", "quantize_row_q6_K_ref", T_Q6_K, 256, 210},
	};
	static float w[N];
	static uint8_t wq[N / 32 * 34 + N / 256 * 210];
	for (int t = 0; t < 3; t++) {
		quant_fn ref = (quant_fn)dlsym(base, wt[t].ref);
		if (!ref) {
			fprintf(stderr, "%s\n", dlerror());
			return 1;
		}
		const uint8_t *act = wt[t].type == T_Q8_0 ? &q80[0][0] : &q8k[0][0];
		size_t actBytes = wt[t].type == T_Q8_0 ? sizeof q80[0] : sizeof q8k[0];
		for (int r = 0; r < ROWS; r++) {
			for (int i = 0; i < N; i++) w[i] = (0.01f + 0.02f * r) * next_normal() + (r == 3 ? 0.03f : 0.0f);
			ref(w, wq, N);
			printf("%s{\"type\": \"%s\", \"blocks\": ", t || r ? ", " : "", wt[t].name);
			hex(wq, N / wt[t].block * wt[t].bytes);
			printf(", \"dots\": [");
			for (int a = 0; a < ACTS; a++) {
				float s = 0;
				traits(wt[t].type)->vec_dot(N, &s, 0, wq, 0, act + a * actBytes, 0, 1);
				uint32_t bits;
				memcpy(&bits, &s, 4);
				printf("%s%u", a ? ", " : "", bits);
			}
			printf("]}");
		}
	}
	printf("]}\n");
	return 0;
}
