// ggml_act_fixture writes, as JSON, how ggml-cpu's x86 AVX2 build (the haswell variant that
// node-llama-cpp's prebuilt loads on an AVX2 machine) rounds activations for its quantized
// products (from_float of Q8_0 and Q8_K: quantize_row_q8_0, quantize_row_q8_K) and the dot
// products it takes of them with Q8_0, Q4_K and Q6_K weight rows (the vec_dot of each type, and
// the gemm and gemv kernels of a Q4_K weight it repacked for AVX2, 8 rows interleaved), for engine/internal/quant's bit-exactness tests. It loads the libraries at run time (from the
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
// ggml::cpu::repack::gemm / gemv<block_q4_K, 8, 8, GGML_TYPE_Q8_K> and ggml_quantize_mat_t<8, Q8_K>.
typedef void (*gemm_fn)(int n, float *s, size_t bs, const void *vx, const void *vy, int nr, int nc);
typedef void (*qmat_fn)(const float *x, void *vy, int64_t nrow, int64_t n_per_row);
#define GEMM_Q4_K "_ZN4ggml3cpu6repack4gemmI10block_q4_KLl8ELl8EL9ggml_type15EEEviPfmPKvS7_ii"
#define GEMV_Q4_K "_ZN4ggml3cpu6repack4gemvI10block_q4_KLl8ELl8EL9ggml_type15EEEviPfmPKvS7_ii"
#define QMAT_Q8_K "_Z19ggml_quantize_mat_tILl8EL9ggml_type15EEvPKfPvll"

typedef struct { uint16_t d, dmin; uint8_t scales[12], qs[128]; } block_q4_K;
typedef struct { uint16_t d[8], dmin[8]; uint8_t scales[96], qs[1024]; } block_q4_Kx8;

// make_block_q4_Kx8 is repack.cpp's (blck_size_interleave 8): what ggml-cpu makes of 8 rows'
// Q4_K blocks when it repacks a weight for AVX2.
static block_q4_Kx8 make_block_q4_Kx8(const block_q4_K *in) {
	block_q4_Kx8 out;
	for (int i = 0; i < 8; i++) out.d[i] = in[i].d;
	for (int i = 0; i < 8; i++) out.dmin[i] = in[i].dmin;
	for (int i = 0; i < 256 * 4 / 8; ++i) memcpy(&out.qs[i * 8], &in[i % 8].qs[(i / 8) * 8], 8);
	uint8_t s[8], m[8];
	for (int h = 0; h < 2; h++) {
		for (int i = 0; i < 4; i++) {
			for (int j = 0; j < 8; j++) {
				if (h == 0) {
					s[j] = in[j].scales[i] & 63;
					m[j] = in[j].scales[i + 4] & 63;
				} else {
					s[j] = ((in[j].scales[i] & 192) >> 2) | (in[j].scales[i + 8] & 15);
					m[j] = ((in[j].scales[i + 4] & 192) >> 2) | ((in[j].scales[i + 8] & 240) >> 4);
				}
			}
			uint8_t *o = out.scales + 48 * h + 12 * i;
			for (int j = 0; j < 4; j++) {
				o[j] = (s[j] & 63) + ((s[j + 4] & 48) << 2);
				o[4 + j] = (m[j] & 63) + ((m[j + 4] & 48) << 2);
				o[8 + j] = (s[j + 4] & 15) + ((m[j + 4] & 15) << 4);
			}
		}
	}
	return out;
}

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

// repacked writes 8 Q4_K weight rows (reference quantizer), 8 activation rows, and the
// repacked kernels' products: gemm over the activations in groups of 4 (quantized as the
// kernel's caller does, ggml_quantize_mat_t), gemv over each alone (quantize_row_q8_K).
static int repacked(void *base, void *cpu) {
	quant_fn ref = (quant_fn)dlsym(base, "quantize_row_q4_K_ref");
	gemm_fn gemm = (gemm_fn)dlsym(cpu, GEMM_Q4_K), gemv = (gemm_fn)dlsym(cpu, GEMV_Q4_K);
	qmat_fn qmat = (qmat_fn)dlsym(cpu, QMAT_Q8_K);
	traits_fn traits = (traits_fn)dlsym(cpu, "ggml_get_type_traits_cpu");
	if (!ref || !gemm || !gemv || !qmat || !traits) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	enum { NB = N / 256, R = 8 };
	static block_q4_K rows[8][NB];
	static block_q4_Kx8 packed[NB];
	static float w[N], x[R][N], gemmOut[R][8], gemvOut[R][8];
	static uint8_t qa[4 * NB * (16 + 1024 + 128)], qrow[NB * 292];
	for (int r = 0; r < 8; r++) {
		for (int i = 0; i < N; i++) w[i] = 0.02f * next_normal() + 0.004f * (r - 4);
		ref(w, rows[r], N);
	}
	for (int b = 0; b < NB; b++) {
		block_q4_K in[8];
		for (int r = 0; r < 8; r++) in[r] = rows[r][b];
		packed[b] = make_block_q4_Kx8(in);
	}
	for (int r = 0; r < R; r++) fill(x[r], r == 3 ? 7 : r % 3);
	for (int g = 0; g < R; g += 4) {
		qmat(x[g], qa, 4, N);
		gemm(N, gemmOut[g], 8, packed, qa, 4, 8);
	}
	for (int r = 0; r < R; r++) {
		traits(T_Q8_K)->from_float(x[r], qrow, N);
		gemv(N, gemvOut[r], 8, packed, qrow, 1, 8);
	}
	printf("{\"weights\": [");
	for (int r = 0; r < 8; r++) {
		printf(r ? ", " : "");
		hex(rows[r], sizeof rows[r]);
	}
	printf("], \"acts\": [");
	for (int r = 0; r < R; r++) {
		printf(r ? ", " : "");
		hex(x[r], sizeof x[r]);
	}
	for (int k = 0; k < 2; k++) {
		printf(k ? "], \"gemv\": [" : "], \"gemm\": [");
		for (int r = 0; r < R; r++) {
			printf(r ? ", [" : "[");
			for (int o = 0; o < 8; o++) {
				uint32_t bits;
				memcpy(&bits, k ? &gemvOut[r][o] : &gemmOut[r][o], 4);
				printf("%s%u", o ? ", " : "", bits);
			}
			printf("]");
		}
	}
	printf("]}");
	return 0;
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
	printf("], \"repacked_q4_k\": ");
	if (repacked(base, cpu)) return 1;
	// ggml_vec_swiglu_f32 over a row of 40 (5 groups of 8 through ggml_v_silu, the last with
	// exp's overflow and underflow branches) and of 37 (4 groups, a tail of 5 through expf).
	void (*swiglu)(int n, float *y, const float *x, const float *g) = (void (*)(int, float *, const float *, const float *))dlsym(cpu, "ggml_vec_swiglu_f32");
	if (!swiglu) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	static float sx[40], sg[40], sy[40];
	for (int i = 0; i < 40; i++) {
		sx[i] = (i < 32) ? 4.0f * next_normal() : (float[]){-90.0f, 90.0f, -150.0f, 150.0f, -1e-3f, 88.7f, -88.7f, 0.0f}[i - 32];
		sg[i] = next_normal();
	}
	printf(", \"swiglu\": {\"x\": ");
	hex(sx, sizeof sx);
	printf(", \"g\": ");
	hex(sg, sizeof sg);
	for (int k = 0; k < 2; k++) {
		int n = k ? 37 : 40;
		memset(sy, 0, sizeof sy);
		swiglu(n, sy, sx, sg);
		printf(k ? ", \"y37\": " : ", \"y40\": ");
		hex(sy, n * 4);
	}
	printf("}");
	// ggml_vec_dot_f32 (what a float32 mat-mul row not a multiple of 8 long goes through: the
	// rank-r LoRA B product) at lengths through each of its tails.
	void (*dotf32)(int n, float *s, size_t bs, const float *x, size_t bx, const float *y, size_t by, int nrc) =
		(void (*)(int, float *, size_t, const float *, size_t, const float *, size_t, int))dlsym(cpu, "ggml_vec_dot_f32");
	if (!dotf32) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	static float dx[100], dy[100];
	for (int i = 0; i < 100; i++) {
		dx[i] = next_normal();
		dy[i] = 0.1f * next_normal();
	}
	printf(", \"vec_dot_f32\": {\"x\": ");
	hex(dx, sizeof dx);
	printf(", \"y\": ");
	hex(dy, sizeof dy);
	printf(", \"dots\": [");
	int lens[] = {1, 3, 4, 7, 12, 13, 31, 32, 45, 64, 77, 100};
	for (int i = 0; i < 12; i++) {
		float r;
		dotf32(lens[i], &r, 0, dx, 0, dy, 0, 1);
		uint32_t bits;
		memcpy(&bits, &r, 4);
		printf("%s[%d, %u]", i ? ", " : "", lens[i], bits);
	}
	printf("]}");
	printf("}\n");
	return 0;
}
