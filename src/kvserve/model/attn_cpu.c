/* Attention over the paged KV pool on the CPU, one call per layer (kvserve.model._attn).
 *
 * The arithmetic is llama.cpp's CPU flash attention for a row of queries at a time
 * (ggml_compute_forward_flash_attn_ext_f16_one_chunk, the path llama-server takes for decode and
 * for prompts of fewer than 64 tokens), on an x86 build with AVX-512:
 *
 *   for each query row and head:  q' = q rounded to the K cache's type (float16 or float32)
 *     for each visible key j in position order:
 *       s = dot(q', k_j) * scale            (the dot: 4 accumulators of 16 lanes over D in steps
 *                                            of 64, fused multiply-adds, summed (a0+a2)+(a1+a3),
 *                                            the lanes in _mm512_reduce_add_ps's tree; leftovers
 *                                            in double)
 *       softcap: s = c * tanhf(s / c)
 *       if s > M: ms = expf(M - s), M = s, acc = acc * ms, vs = 1   else vs = expf(s - M), ms = 1
 *       acc = fma(v_j, vs, acc)             (acc in the V cache's type: float16 rounds every step)
 *       S = fma(S, ms, vs)
 *     out = acc * (1 / S)
 *
 * With a float16 cache and head sizes of 128 or more, the first D & ~127 elements of acc take the
 * float16 arithmetic of llama.cpp's AVX512-FP16 build (acc = v·f16(vs) + acc and acc·f16(ms), one
 * float16 rounding each): with the CPU's own float16 instructions, else emulated exactly.
 *
 * A row's output depends on nothing but its own query and keys, walked in the same order whatever
 * the batch (prefill chunk, cached prefix, decode batch of any width), the thread count or the
 * instruction set: scalar, AVX-512 and AVX512-FP16 functions compute the same operations, so cached and uncached
 * evaluations, batch widths and chunkings give the same bits.
 *
 * Keys: position p of a sequence lies in cache row table[p / page_size] * page_size + p % page_size;
 * query row t (position pos) sees positions [max(0, pos - window + 1), pos] (window 0: [0, pos]).
 * Threads: one OpenMP region per call where the work pays for it, items (up to 4 rows of a sequence
 * and the query heads of one kv head) shared out dynamically.
 * Files: this one (the module, the driver), attn_scalar.c (the reference functions), attn_avx512.c
 * (AVX-512, AVX512-FP16), attn_cpu.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "attn_cpu.h"

/* ---- the call ---- */

typedef struct {
    const float *q;
    int64_t qrs, H, Hkv, D;     /* query row stride (elements), heads, kv heads, head dim */
    const char *k, *v;
    int64_t krs;                /* K/V cache row stride in elements (Hkv * D for a contiguous pool) */
    const int64_t *seqs;        /* [n_seq, 4]: first query row, rows, first position, table offset */
    int64_t n_seq;
    const int64_t *tables;      /* page tables, concatenated */
    int64_t ps, window;
    float *out;
    int64_t ors;                /* output row stride */
} call;

typedef struct {
    int64_t seq, t0, rows, hk;
} task;

static void make_item(const call *c, const params *p, const task *tk, item *it) {
    const int64_t *sq = c->seqs + 4 * tk->seq, g = c->H / c->Hkv, D = p->D;
    const size_t es = p->f16 ? 2 : 4;
    it->n = 0;
    it->lo_all = INT64_MAX;
    it->hi_all = 0;
    for (int64_t t = tk->t0; t < tk->t0 + tk->rows; t++) {
        const int64_t pos = sq[2] + (t - sq[0]);
        const int64_t lo = c->window > 0 && pos + 1 > c->window ? pos + 1 - c->window : 0;
        for (int64_t h = tk->hk * g; h < (tk->hk + 1) * g; h++) {
            const int i = it->n++;
            it->q[i] = c->q + t * c->qrs + h * D;
            it->out[i] = c->out + t * c->ors + h * D;
            it->lo[i] = lo;
            it->hi[i] = pos + 1;
        }
        if (lo < it->lo_all) it->lo_all = lo;
        if (pos + 1 > it->hi_all) it->hi_all = pos + 1;
    }
    it->k = c->k + (size_t)(tk->hk * D) * es;
    it->v = c->v + (size_t)(tk->hk * D) * es;
    it->rs = c->krs;
    it->table = c->tables + sq[3];
    it->ps = c->ps;
}

/* per-thread work buffer, grown on demand (kept for the thread's life) */
static float *work_buffer(size_t floats) {
    static __thread float *buf;
    static __thread size_t cap;
    if (floats > cap) {
        free(buf);
        cap = (floats + 1023) / 1024 * 1024;
        buf = aligned_alloc(64, cap * sizeof(float));
    }
    return buf;
}

static void run_task(const call *c, const params *p, const task *t, int use512) {
    const int64_t D = p->D;
    float *buf = work_buffer(work_floats(D));
    task tk = *t;
    item it;
    if (!use512) tk.rows = 1; /* (the scalar functions take any item; keep it small) */
    for (int64_t r = t->t0; r < t->t0 + t->rows; r += tk.rows) {
        tk.t0 = r;
        make_item(c, p, &tk, &it);
#ifdef ATTN_X86
        if (use512)
            item_512(&it, p, buf);
        else
#endif
            item_ref(&it, p, buf);
    }
}

static void attend(const call *c, const params *p, int nthreads, int isa) {
    const int64_t g = c->H / c->Hkv, D = p->D;
    const int64_t R = g >= MAX_CHAINS ? 1 : (MAX_CHAINS / g < MAX_ROWS ? MAX_CHAINS / g : MAX_ROWS);
    int64_t n_tasks = 0, work = 0;
    for (int64_t s = 0; s < c->n_seq; s++) {
        const int64_t n = c->seqs[4 * s + 1], p0 = c->seqs[4 * s + 2];
        n_tasks += (n + R - 1) / R * c->Hkv;
        work += n * (c->window > 0 && p0 + n > c->window ? c->window : p0 + n);
    }
    task small[64];
    task *tasks = n_tasks <= 64 ? small : malloc((size_t)n_tasks * sizeof(task));
    int64_t k = 0;
    for (int64_t s = 0; s < c->n_seq; s++) {
        const int64_t q0 = c->seqs[4 * s], n = c->seqs[4 * s + 1];
        for (int64_t t = q0; t < q0 + n; t += R)
            for (int64_t hk = 0; hk < c->Hkv; hk++) tasks[k++] = (task){s, t, t + R < q0 + n ? R : q0 + n - t, hk};
    }
    const int use512 = isa && D % 64 == 0 && g <= MAX_CHAINS;
    /* threads only where the work pays for waking them (~0.1 ms of it) */
    if (nthreads <= 1 || n_tasks < 2 || work * c->H * D < (1 << 20)) {
        for (int64_t i = 0; i < n_tasks; i++) run_task(c, p, &tasks[i], use512);
    } else {
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
        for (int64_t i = 0; i < n_tasks; i++) run_task(c, p, &tasks[i], use512);
    }
    if (tasks != small) free(tasks);
}

/* ---- Python ---- */

static PyObject *py_attend(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, sp, tp, op;
    long long qrs, H, Hkv, D, krs, n_seq, ps, window, ors;
    int f16, nthreads, isa;
    float scale, softcap;
    if (!PyArg_ParseTuple(args, "KLLLLKKLiKLKLLKLffii", &qp, &qrs, &H, &Hkv, &D, &kp, &vp, &krs, &f16, &sp, &n_seq,
                          &tp, &ps, &window, &op, &ors, &scale, &softcap, &nthreads, &isa))
        return NULL;
    if (H <= 0 || Hkv <= 0 || H % Hkv || D <= 0 || ps <= 0 || n_seq < 0) {
        PyErr_SetString(PyExc_ValueError, "attn.attend: bad shape");
        return NULL;
    }
    call c = {(const float *)qp, qrs, H, Hkv, D, (const char *)kp, (const char *)vp, krs, (const int64_t *)sp,
              n_seq, (const int64_t *)tp, ps, window, (float *)op, ors};
    params p = {D, f16, f16 && D >= 128 ? D & ~(long long)127 : 0, 0, softcap != 0.0f ? scale / softcap : scale, softcap};
    if (isa < 0 || isa > 2) isa = 2;
    if (isa && !has_512()) isa = 0;
#ifdef ATTN_X86
    if (isa == 2 && !has_fp16()) isa = 1;
#endif
    p.fp16 = isa == 2;
    Py_BEGIN_ALLOW_THREADS
    attend(&c, &p, nthreads, isa);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_best_isa(PyObject *self, PyObject *args) {
#ifdef ATTN_X86
    if (has_512() && has_fp16()) return PyLong_FromLong(2);
#endif
    return PyLong_FromLong(has_512());
}

static PyMethodDef methods[] = {
    {"attend", py_attend, METH_VARARGS,
     "attend(q, q_row_stride, H, Hkv, D, k, v, kv_row_stride, f16, seqs, n_seq, tables, page_size, window, out, "
     "out_row_stride, scale, softcap, nthreads, isa): one layer's attention (pointers as integers)"},
    {"best_isa", py_best_isa, METH_NOARGS,
     "2 AVX-512 with AVX512-FP16, 1 AVX-512, 0 scalar: the best this CPU runs (isa= caps it per call)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_attn", NULL, -1, methods};

PyMODINIT_FUNC PyInit__attn(void) { return PyModule_Create(&module); }
