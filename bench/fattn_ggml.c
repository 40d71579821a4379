/* llama.cpp's CPU flash attention (ggml_flash_attn_ext) on inputs read from a file, for
 * bench/attn_vs_llama.py. Built against a llama.cpp build by that script.
 *
 * Input (little endian): int32 T, H, Hkv, D, L, pos0, f16, nthreads; float32 scale; then q float32
 * [H][T][D], k and v [Hkv][L][D] (float16 bits or float32). Query t sees keys [0, pos0 + t].
 * Output: float32 [T][H][D]. An optional third argument repeats the computation that many times and
 * prints the process CPU seconds per repetition.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 3;
    int hdr[8];
    float scale;
    if (fread(hdr, 4, 8, f) != 8 || fread(&scale, 4, 1, f) != 1) return 4;
    const int T = hdr[0], H = hdr[1], Hkv = hdr[2], D = hdr[3], L = hdr[4], pos0 = hdr[5], f16 = hdr[6], nth = hdr[7];
    const size_t es = f16 ? 2 : 4;
    struct ggml_init_params ip = {(size_t)64 << 20, NULL, false};
    ip.mem_size += (size_t)(T * H * D * 4) * 3 + (size_t)L * Hkv * D * es * 2 + (size_t)L * (T + 64) * 2;
    struct ggml_context *ctx = ggml_init(ip);
    const enum ggml_type kt = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    struct ggml_tensor *q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, T, H);
    struct ggml_tensor *k = ggml_new_tensor_3d(ctx, kt, D, L, Hkv);
    struct ggml_tensor *v = ggml_new_tensor_3d(ctx, kt, D, L, Hkv);
    struct ggml_tensor *m = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, L, T);
    if (fread(q->data, 4, (size_t)T * H * D, f) != (size_t)T * H * D) return 5;
    if (fread(k->data, es, (size_t)L * Hkv * D, f) != (size_t)L * Hkv * D) return 6;
    if (fread(v->data, es, (size_t)L * Hkv * D, f) != (size_t)L * Hkv * D) return 7;
    fclose(f);
    ggml_fp16_t *mp = (ggml_fp16_t *)m->data;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < L; j++) mp[t * L + j] = ggml_fp32_to_fp16(j <= pos0 + t ? 0.0f : -INFINITY);
    struct ggml_tensor *o = ggml_flash_attn_ext(ctx, q, k, v, m, scale, 0.0f, 0.0f);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, o);
    struct ggml_cplan plan = ggml_graph_plan(gf, nth, NULL);
    plan.work_data = malloc(plan.work_size + 64);
    if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) return 8;
    if (argc == 4) {
        const int reps = atoi(argv[3]);
        struct timespec a, b;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
        for (int r = 0; r < reps; r++) ggml_graph_compute(gf, &plan);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
        printf("%.9f\n", ((b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec)) / (reps > 0 ? reps : 1));
    }
    FILE *g = fopen(argv[2], "wb");
    fwrite(o->data, 4, (size_t)T * H * D, g);
    fclose(g);
    ggml_free(ctx);
    return 0;
}
