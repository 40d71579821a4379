// llama.cpp's graph for one prompt, every contiguous float32 node written to $DUMP_OUT as it is
// computed (a 128-byte name, int64 ne[4], the floats), for bench/ops_vs_llama.py. Built by that
// script against a llama.cpp build; takes llama.cpp's common flags (-m, -p, -c, -b, -t, -fa ...).
#include "arg.h"
#include "common.h"
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include <clocale>
#include <cstdio>
#include <cstring>
#include <vector>
#include <string>
static FILE *out;
static bool cb(struct ggml_tensor *t, bool ask, void *) {
    if (ask) return true;
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
    const size_t n = ggml_nelements(t);
    std::vector<float> buf(n);
    ggml_backend_tensor_get(t, buf.data(), 0, n * 4);
    char name[128] = {0};
    strncpy(name, t->name, 127);
    fwrite(name, 1, 128, out);
    int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
    fwrite(ne, 8, 4, out);
    fwrite(buf.data(), 4, n, out);
    return true;
}
int main(int argc, char **argv) {
    std::setlocale(LC_NUMERIC, "C");
    common_params params;
    common_init();
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_COMMON)) return 1;
    out = fopen(getenv("DUMP_OUT"), "wb");
    llama_backend_init();
    params.cb_eval = cb;
    params.cb_eval_user_data = nullptr;
    params.warmup = false;
    auto init = common_init_from_params(params);
    auto *ctx = init->context();
    const llama_vocab *vocab = llama_model_get_vocab(init->model());
    std::vector<llama_token> tokens = common_tokenize(ctx, params.prompt, llama_vocab_get_add_bos(vocab), true);
    for (auto t : tokens) fprintf(stderr, "tok %d\n", t);
    common_batch batch = common_batch_get_one(ctx, tokens);
    if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get())) return 2;
    fclose(out);
    llama_backend_free();
    return 0;
}
