// ggml_dump_ops runs llama.cpp (the prebuilt libllama of @node-llama-cpp/linux-x64) on a GGUF over a
// batch of tokens and dumps, through the eval callback, the inputs and outputs of every
// mat-mul with a quantized weight (N.bin: src1 then dst, float32) and the outputs of GET_ROWS
// and RMS_NORM (nN-name.bin), with an index (index.txt). Development only: it is how the
// GGMLActivations differences were traced (docs/design-notes.md, GGUF in and out). Build with
// the headers of the release's source (node-llama-cpp ships it as llama/gitRelease.bundle):
//
//	git clone -q /tmp/llamacpp/node_modules/node-llama-cpp/llama/gitRelease.bundle /tmp/llsrc
//	B=/tmp/llamacpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
//	gcc -O1 -o /tmp/dumpops scripts/ggml_dump_ops.c -I/tmp/llsrc/include -I/tmp/llsrc/ggml/include
//	    -L$B -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -l:libggml-base.so -Wl,-rpath,$B  (one line)
//	/tmp/dumpops $B model.gguf OUTDIR 5 77 301 12 …
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

static FILE *idx;
static int seq = 0;
static const char *outdir;

static bool cb(struct ggml_tensor *t, bool ask, void *ud) {
	(void)ud;
	if (ask) return t->op == GGML_OP_MUL_MAT || t->op == GGML_OP_GET_ROWS || t->op == GGML_OP_RMS_NORM;
	if (t->op != GGML_OP_MUL_MAT) {
		char p[512];
		snprintf(p, sizeof p, "%s/n%d-%s.bin", outdir, seq, t->name);
		fprintf(idx, "#%d %s %s %lld %lld\n", seq, t->name, ggml_op_name(t->op), (long long)t->ne[0], (long long)t->ne[1]);
		seq++;
		FILE *f = fopen(p, "wb");
		fwrite(t->data, 1, ggml_nbytes(t), f);
		fclose(f);
		return true;
	}
	const struct ggml_tensor *a = t->src[0], *b = t->src[1];
	fprintf(idx, "%d %s %s %s %lld %lld %s %lld %lld %lld %d\n", seq, t->name, a->name, ggml_type_name(a->type), (long long)a->ne[0], (long long)a->ne[1],
		ggml_type_name(b->type), (long long)b->ne[0], (long long)b->ne[1], (long long)b->ne[2], ggml_is_contiguous(b));
	if (a->type != GGML_TYPE_F32 && b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_is_contiguous(t)) {
		char p[512];
		snprintf(p, sizeof p, "%s/%d.bin", outdir, seq);
		FILE *f = fopen(p, "wb");
		fwrite(b->data, 1, ggml_nbytes(b), f);
		fwrite(t->data, 1, ggml_nbytes(t), f);
		fclose(f);
	}
	seq++;
	return true;
}

int main(int argc, char **argv) {
	if (argc < 5) {
		fprintf(stderr, "usage: %s BINS_DIR MODEL.gguf OUTDIR TOKEN...\n", argv[0]);
		return 2;
	}
	ggml_backend_load_all_from_path(argv[1]);
	outdir = argv[3];
	char p[512];
	snprintf(p, sizeof p, "%s/index.txt", outdir);
	idx = fopen(p, "w");
	struct llama_model_params mp = llama_model_default_params();
	mp.n_gpu_layers = 0;
	struct llama_model *m = llama_model_load_from_file(argv[2], mp);
	if (!m) return 1;
	struct llama_context_params cp = llama_context_default_params();
	cp.n_ctx = 256; cp.n_batch = 256; cp.n_ubatch = 256; cp.n_threads = 1; cp.n_threads_batch = 1;
	cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32; cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
	cp.cb_eval = cb; cp.cb_eval_user_data = NULL;
	struct llama_context *c = llama_init_from_model(m, cp);
	if (!c) return 1;
	int n = argc - 4;
	struct llama_batch batch = llama_batch_init(n, 0, 1);
	for (int i = 0; i < n; i++) {
		batch.token[i] = atoi(argv[4 + i]); batch.pos[i] = i; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = 0; batch.logits[i] = 1;
	}
	batch.n_tokens = n;
	if (llama_decode(c, batch)) return 2;
	fclose(idx);
	return 0;
}
