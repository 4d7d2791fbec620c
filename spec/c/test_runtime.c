/* test_runtime.c -- tensors, views, memory accounting and limits, errors,
 * tier discipline, token ids checked by the kernels, SHA-256. */
#include <stdio.h>
#include <string.h>
#include "internal.h"     /* white-box: reads zt_tensor's fields */
#include "kernels.h"

/* OpenBLAS extensions (the runtime's GEMMs need one OpenBLAS thread) */
void openblas_set_num_threads(int n);
int openblas_get_num_threads(void);

static int passed, failed;
#define CHECK(name, cond, ...) do { \
    if (cond) { passed++; printf("ok %s\n", name); } \
    else { failed++; printf("FAIL %s: ", name); printf(__VA_ARGS__); printf(" (%s:%d)\n", __FILE__, __LINE__); } \
} while (0)

static void test_tensors(void)
{
    int64_t shape[2] = { 3, 5 };
    zt_tensor *t = NULL, *v = NULL;
    size_t before = zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_PARAMS);
    int rc = zt_tensor_new(&t, ZT_TIER_DEVICE, ZT_CAT_PARAMS, ZT_F32, 2, shape);
    CHECK("tensor_new", rc == ZT_OK && t && t->numel == 15, "rc %d", rc);
    CHECK("tensor zero-filled", ((float *)t->data)[14] == 0.0f, "not zero");
    CHECK("accounting +60", zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_PARAMS) == before + 60,
          "current %zu", zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_PARAMS));
    int64_t vs[1] = { 5 };
    rc = zt_tensor_view(&v, t, 10, 1, vs);
    CHECK("view", rc == ZT_OK && v->data == (float *)t->data + 10, "rc %d", rc);
    zt_tensor *bad = NULL;
    rc = zt_tensor_view(&bad, t, 11, 1, vs);
    CHECK("view out of range rejected", rc == ZT_EINVAL && bad == NULL &&
          strstr(zt_last_error(), "outside") != NULL, "rc %d msg %s", rc, zt_last_error());
    zt_tensor_release(t);   /* the view keeps the storage */
    CHECK("storage alive while a view holds it",
          zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_PARAMS) == before + 60, "freed early");
    ((float *)v->data)[0] = 1.5f;
    zt_tensor_release(v);
    CHECK("storage freed with the last reference",
          zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_PARAMS) == before, "leak");
    CHECK("peak kept", zt_mem_peak(ZT_TIER_DEVICE, ZT_CAT_PARAMS) >= before + 60, "peak");
    int64_t huge[1] = { (int64_t)1 << 62 };
    rc = zt_tensor_new(&t, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, huge);
    CHECK("a size that overflows bytes is rejected", rc == ZT_EINVAL && t == NULL &&
          strstr(zt_last_error(), "do not fit in memory"), "rc %d msg %s", rc, zt_last_error());
    int64_t zero[1] = { 0 };
    rc = zt_tensor_new(&t, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, zero);
    CHECK("zero dimension rejected", rc == ZT_EINVAL && strstr(zt_last_error(), "dimension 0"),
          "rc %d msg %s", rc, zt_last_error());
}

static void test_limit(void)
{
    zt_tensor *a = NULL, *b = NULL;
    int64_t s[1] = { 1 << 20 };   /* 4 MiB */
    int rc = zt_mem_set_limit(ZT_TIER_DEVICE, 6u << 20);
    CHECK("set limit", rc == ZT_OK, "rc %d", rc);
    rc = zt_tensor_new(&a, ZT_TIER_DEVICE, ZT_CAT_ACTIVATIONS, ZT_F32, 1, s);
    CHECK("under the limit", rc == ZT_OK, "rc %d: %s", rc, zt_last_error());
    rc = zt_tensor_new(&b, ZT_TIER_DEVICE, ZT_CAT_GRADS, ZT_F32, 1, s);
    const char *msg = zt_last_error();
    CHECK("over the limit fails with ELIMIT", rc == ZT_ELIMIT && b == NULL, "rc %d", rc);
    CHECK("limit message names request, categories and limit",
          strstr(msg, "requested 4.00 MiB for grads") && strstr(msg, "activations 4.00 MiB") &&
          strstr(msg, "6.00 MiB"), "msg: %s", msg);
    CHECK("failed allocation not accounted",
          zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_GRADS) == 0, "grads %zu",
          zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_GRADS));
    rc = zt_mem_set_limit(ZT_TIER_DEVICE, 1u << 20);
    CHECK("limit below use rejected", rc == ZT_EINVAL, "rc %d", rc);
    rc = zt_tensor_new(&b, ZT_TIER_HOST, ZT_CAT_OPTIM, ZT_F32, 1, s);
    CHECK("host tier not limited by device limit", rc == ZT_OK, "rc %d", rc);
    zt_tensor_release(a);
    zt_tensor_release(b);
    zt_mem_set_limit(ZT_TIER_DEVICE, 0);
}

static void test_ops_validation(void)
{
    int64_t s2[2] = { 4, 8 }, s1[1] = { 7 };
    zt_tensor *x = NULL, *w = NULL, *o = NULL;
    zt_tensor_new(&x, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, s2);
    zt_tensor_new(&w, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, s1);
    zt_tensor_new(&o, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, s2);
    int rc = zt_matmul_forward(o, x, w, NULL);
    CHECK("matmul rejects a 1-D weight", rc == ZT_EINVAL && strstr(zt_last_error(), "2-D"),
          "rc %d msg %s", rc, zt_last_error());
    rc = zt_add(o, w);
    CHECK("add rejects unequal sizes", rc == ZT_EINVAL, "rc %d", rc);
    rc = zt_attention_forward(o, o, x, 4);
    CHECK("attention rejects a 2-D qkv", rc == ZT_EINVAL && strstr(zt_last_error(), "(B,T,3C)"),
          "msg %s", zt_last_error());
    {   /* bf16 activations: qkv, out (and dqkv) bf16 together; decode is f32 */
        int64_t sq[3] = { 1, 2, 12 }, so[3] = { 1, 2, 4 }, sl[3] = { 1, 2, 2 };
        zt_tensor *q16 = NULL, *o32 = NULL, *o16 = NULL, *lse = NULL, *dq16 = NULL, *dq32 = NULL;
        zt_tensor_new(&q16, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_BF16, 3, sq);
        zt_tensor_new(&dq16, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_BF16, 3, sq);
        zt_tensor_new(&dq32, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 3, sq);
        zt_tensor_new(&o32, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 3, so);
        zt_tensor_new(&o16, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_BF16, 3, so);
        zt_tensor_new(&lse, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 3, sl);
        uint8_t zeros[96] = { 0 };
        zt_tensor_write(q16, zeros, 48); zt_tensor_write(o16, zeros, 16);
        zt_tensor_write(o32, zeros, 32);
        rc = zt_attention_forward(o32, lse, q16, 2);
        CHECK("attention: a bf16 qkv needs a bf16 out, said so",
              rc == ZT_EINVAL && strstr(zt_last_error(), "out must be bf16 as qkv is") &&
              strstr(zt_last_error(), "bf16 activations"), "rc %d msg %s", rc, zt_last_error());
        rc = zt_attention_forward(o16, lse, q16, 2);
        CHECK("attention: bf16 qkv and out run", rc == ZT_OK, "rc %d msg %s", rc, zt_last_error());
        rc = zt_attention_backward(dq32, o32, q16, o16, lse, 2);
        CHECK("attention backward: a bf16 qkv needs a bf16 dqkv",
              rc == ZT_EINVAL && strstr(zt_last_error(), "dqkv must be bf16"), "rc %d msg %s", rc,
              zt_last_error());
        rc = zt_attention_backward(dq16, o32, q16, o16, lse, 2);
        CHECK("attention backward: a bf16 qkv needs a bf16 dout (the GEMM's bf16 input gradient)",
              rc == ZT_EINVAL && strstr(zt_last_error(), "dout must be bf16 as qkv is"),
              "rc %d msg %s", rc, zt_last_error());
        rc = zt_attention_backward(dq16, o16, q16, o16, lse, 2);
        CHECK("attention backward: bf16 qkv, out, dout, dqkv run", rc == ZT_OK,
              "rc %d msg %s", rc, zt_last_error());
        zt_tensor_release(q16); zt_tensor_release(dq16); zt_tensor_release(dq32);
        zt_tensor_release(o32); zt_tensor_release(o16); zt_tensor_release(lse);
    }
    {   /* a token outside the vocabulary: skipped by the kernels (never a wild
         * read or write), reported by the op; the host never reads the ids */
        int64_t sv[2] = { 4, 8 }, sd[3] = { 1, 2, 8 }, st[2] = { 1, 2 };
        zt_tensor *dwte = NULL, *dwpe = NULL, *dout = NULL, *tok = NULL, *out = NULL;
        zt_tensor_new(&dwte, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, sv);
        zt_tensor_new(&dwpe, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, sv);
        zt_tensor_new(&dout, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 3, sd);
        zt_tensor_new(&out, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 3, sd);
        zt_tensor_new(&tok, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_I32, 2, st);
        int32_t ids[2] = { 1, 100000000 };
        zt_tensor_write(tok, ids, sizeof ids);
        zt_fill(dout, 1.0f);
        rc = zt_encoder_backward(dwte, dwpe, dout, tok);
        CHECK("encoder backward rejects a token outside the vocabulary",
              rc == ZT_EINVAL && strstr(zt_last_error(), "1 of 2 tokens are outside the vocabulary [0,4)")
              && strstr(zt_last_error(), "vocabulary size V disagree"), "rc %d msg %s", rc, zt_last_error());
        float w[32];
        zt_tensor_read(dwte, w, sizeof w);
        CHECK("encoder backward still scatters the valid token", w[8] == 1.0f && w[0] == 0.0f,
              "row 1 %g row 0 %g", w[8], w[0]);
        rc = zt_encoder_forward(out, tok, dwte, dwpe);
        CHECK("encoder forward rejects a token outside the vocabulary",
              rc == ZT_EINVAL && strstr(zt_last_error(), "outside the vocabulary"), "rc %d msg %s",
              rc, zt_last_error());
        ids[1] = -1;
        zt_tensor_write(tok, ids, sizeof ids);
        rc = zt_encoder_forward(out, tok, dwte, dwpe);
        CHECK("a negative token is outside too", rc == ZT_EINVAL, "rc %d", rc);
        ids[1] = 3;
        zt_tensor_write(tok, ids, sizeof ids);
        rc = zt_encoder_forward(out, tok, dwte, dwpe);
        CHECK("tokens inside the vocabulary pass", rc == ZT_OK, "rc %d %s", rc, zt_last_error());
        {   /* bf16 tables (a bf16 run's stored parameters): the fp32 tables'
             * rows widened; wte and wpe of one dtype */
            zt_tensor *te = NULL, *pe = NULL, *o2 = NULL;
            zt_tensor_new(&te, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_BF16, 2, (int64_t[]){ 4, 8 });
            zt_tensor_new(&pe, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_BF16, 2, sv);
            zt_tensor_new(&o2, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 3, sd);
            zt_randn(dwte, 7, 0, 0.0f, 1.0f); zt_randn(dwpe, 8, 0, 0.0f, 1.0f);
            zt_cast(te, dwte); zt_cast(pe, dwpe);          /* rounded */
            zt_cast(dwte, te); zt_cast(dwpe, pe);          /* widened back: exact */
            rc = zt_encoder_forward(out, tok, dwte, dwpe);
            int rc2 = zt_encoder_forward(o2, tok, te, pe);
            float a[16], b2[16];
            zt_tensor_read(out, a, sizeof a); zt_tensor_read(o2, b2, sizeof b2);
            CHECK("encoder forward from bf16 tables: the widened fp32 tables' rows, bit for bit",
                  rc == ZT_OK && rc2 == ZT_OK && !memcmp(a, b2, sizeof a), "rc %d/%d: %s", rc, rc2,
                  zt_last_error());
            rc = zt_encoder_forward(o2, tok, te, dwpe);
            CHECK("encoder forward refuses bf16 wte with fp32 wpe, naming wpe",
                  rc == ZT_EINVAL && strstr(zt_last_error(), "zt_encoder_forward: wpe must be bf16"),
                  "rc %d: %s", rc, zt_last_error());
            zt_tensor_release(te); zt_tensor_release(pe); zt_tensor_release(o2);
        }
        /* cross-entropy targets: logits (2,4) */
        int64_t sl[2] = { 2, 4 };
        zt_tensor *logits = NULL, *losses = NULL;
        zt_tensor_new(&logits, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, sl);
        zt_tensor_new(&losses, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, st + 1);
        rc = zt_crossentropy(losses, logits, logits, tok, 1.0f, 0);
        CHECK("crossentropy with good targets", rc == ZT_OK, "rc %d %s", rc, zt_last_error());
        ids[0] = 4;
        zt_tensor_write(tok, ids, sizeof ids);
        rc = zt_crossentropy(losses, logits, logits, tok, 1.0f, 0);
        CHECK("crossentropy rejects a target outside the vocabulary",
              rc == ZT_EINVAL && strstr(zt_last_error(), "1 of 2 targets are outside the vocabulary"),
              "rc %d msg %s", rc, zt_last_error());
        zt_tensor_release(logits); zt_tensor_release(losses); zt_tensor_release(out);
        zt_tensor_release(dwte); zt_tensor_release(dwpe); zt_tensor_release(dout); zt_tensor_release(tok);
    }
    {   /* split backward: which NULL combinations are valid */
        int64_t sw[2] = { 3, 8 }, so[2] = { 4, 3 }, sb[1] = { 3 };
        zt_tensor *mw = NULL, *mdw = NULL, *mdb = NULL, *mdo = NULL, *mdx = NULL;
        zt_tensor_new(&mw, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, sw);
        zt_tensor_new(&mdw, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, sw);
        zt_tensor_new(&mdb, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, sb);
        zt_tensor_new(&mdo, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, so);
        zt_tensor_new(&mdx, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, s2);
        rc = zt_matmul_backward(mdx, NULL, NULL, mdo, x, mw);
        CHECK("matmul backward with dweight NULL (input gradient only)", rc == ZT_OK, "rc %d %s", rc,
              zt_last_error());
        rc = zt_matmul_backward(NULL, mdw, mdb, mdo, x, mw);
        CHECK("matmul backward with dinp NULL (weights only)", rc == ZT_OK, "rc %d %s", rc,
              zt_last_error());
        rc = zt_matmul_backward(mdx, NULL, mdb, mdo, x, mw);
        CHECK("matmul backward rejects dbias without dweight",
              rc == ZT_EINVAL && strstr(zt_last_error(), "dbias without dweight"), "rc %d %s", rc,
              zt_last_error());
        rc = zt_matmul_backward(NULL, NULL, NULL, mdo, x, mw);
        CHECK("matmul backward rejects nothing to compute",
              rc == ZT_EINVAL && strstr(zt_last_error(), "nothing to compute"), "rc %d %s", rc,
              zt_last_error());
        int64_t s8[1] = { 8 }, s4[1] = { 4 };
        zt_tensor *lw = NULL, *ldw = NULL, *ldb = NULL, *lm = NULL, *lr = NULL, *ldx = NULL;
        zt_tensor_new(&lw, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, s8);
        zt_tensor_new(&ldw, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, s8);
        zt_tensor_new(&ldb, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, s8);
        zt_tensor_new(&lm, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, s4);
        zt_tensor_new(&lr, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, s4);
        zt_tensor_new(&ldx, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, s2);
        rc = zt_layernorm_backward(NULL, ldw, ldb, x, x, lw, lm, lr);
        CHECK("layernorm backward with dinp NULL", rc == ZT_OK, "rc %d %s", rc, zt_last_error());
        rc = zt_layernorm_backward(ldx, NULL, NULL, x, x, lw, lm, lr);
        CHECK("layernorm backward with dweight, dbias NULL", rc == ZT_OK, "rc %d %s", rc, zt_last_error());
        rc = zt_layernorm_backward(ldx, ldw, NULL, x, x, lw, lm, lr);
        CHECK("layernorm backward rejects dweight without dbias",
              rc == ZT_EINVAL && strstr(zt_last_error(), "pass both"), "rc %d %s", rc, zt_last_error());
        rc = zt_layernorm_backward(NULL, NULL, NULL, x, x, lw, lm, lr);
        CHECK("layernorm backward rejects nothing to compute",
              rc == ZT_EINVAL && strstr(zt_last_error(), "nothing to compute"), "rc %d %s", rc,
              zt_last_error());
        zt_tensor_release(mw); zt_tensor_release(mdw); zt_tensor_release(mdb); zt_tensor_release(mdo);
        zt_tensor_release(mdx); zt_tensor_release(lw); zt_tensor_release(ldw); zt_tensor_release(ldb);
        zt_tensor_release(lm); zt_tensor_release(lr); zt_tensor_release(ldx);
    }
    rc = zt_fill(NULL, 1.0f);
    CHECK("NULL tensor is an error, not a crash", rc == ZT_EINVAL, "rc %d", rc);
    zt_tensor_release(x); zt_tensor_release(w); zt_tensor_release(o);
}

/* An op's operands share one addressable tier; copies between tiers are
 * explicit (zt_copy_async). */
static void test_tiers(void)
{
    int64_t s2[2] = { 4, 8 }, sw[2] = { 8, 8 };
    zt_tensor *hd = NULL, *dv = NULL, *h2 = NULL, *w = NULL;
    zt_tensor_new(&hd, ZT_TIER_HOST, ZT_CAT_OTHER, ZT_F32, 2, s2);
    zt_tensor_new(&h2, ZT_TIER_HOST, ZT_CAT_OTHER, ZT_F32, 2, s2);
    zt_tensor_new(&dv, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, s2);
    zt_tensor_new(&w, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, sw);
    float ones[32];
    for (int i = 0; i < 32; i++) ones[i] = 1.0f;
    zt_tensor_write(dv, ones, sizeof ones);
    int rc = zt_add(hd, dv);
    const char *m = zt_last_error();
    CHECK("add rejects a host and a device operand",
          rc == ZT_EINVAL && strstr(m, "zt_add: y (f32 [4,8] on host) and x (f32 [4,8] on device)") &&
          strstr(m, "different tiers") && strstr(m, "zt_copy_async"), "rc %d msg %s", rc, m);
    float back[32];
    zt_tensor_read(hd, back, sizeof back);
    CHECK("the rejected add wrote nothing", back[0] == 0.0f && back[31] == 0.0f, "%g", back[0]);
    rc = zt_copy(hd, dv);
    CHECK("zt_copy requires one tier", rc == ZT_EINVAL && strstr(zt_last_error(), "different tiers"),
          "rc %d msg %s", rc, zt_last_error());
    rc = zt_matmul_forward(hd, dv, w, NULL);
    CHECK("matmul names the mismatched pair",
          rc == ZT_EINVAL && strstr(zt_last_error(), "out (f32 [4,8] on host) and inp (f32 [4,8] on device)"),
          "rc %d msg %s", rc, zt_last_error());
    rc = zt_copy_async(hd, dv, NULL);
    CHECK("copy_async moves bytes between tiers", rc == ZT_OK, "rc %d %s", rc, zt_last_error());
    rc = zt_add(h2, hd);
    zt_tensor_read(h2, back, sizeof back);
    CHECK("ops on host-tier operands run", rc == ZT_OK && back[5] == 1.0f, "rc %d %g", rc, back[5]);
    /* nvme: no allocator until configured (test_aio.c covers a configured
     * tier), and ops refuse its (unaddressable) bytes */
    zt_tensor *nv = NULL;
    rc = zt_tensor_new(&nv, ZT_TIER_NVME, ZT_CAT_OPTIM, ZT_F32, 2, s2);
    CHECK("no allocator for the nvme tier until configured", rc == ZT_EINVAL && nv == NULL &&
          strstr(zt_last_error(), "nvme tier") && strstr(zt_last_error(), "no allocator") &&
          strstr(zt_last_error(), "zt_nvme_configure"), "rc %d msg %s", rc, zt_last_error());
    CHECK("a failed nvme allocation is not accounted", zt_mem_current(ZT_TIER_NVME, -1) == 0, "%zu",
          zt_mem_current(ZT_TIER_NVME, -1));
    h2->storage->tier = ZT_TIER_NVME;   /* pretend: the op refuses before touching bytes */
    rc = zt_scale(h2, 2.0f);
    h2->storage->tier = ZT_TIER_HOST;
    CHECK("ops reject nvme-tier tensors", rc == ZT_EINVAL && strstr(zt_last_error(), "nvme"),
          "rc %d msg %s", rc, zt_last_error());
    zt_tensor_release(hd); zt_tensor_release(h2); zt_tensor_release(dv); zt_tensor_release(w);
}

/* OpenBLAS runs one thread per call for the process; zt_set_threads sizes
 * OpenMP only, and a GEMM refuses to run if someone changed the count. */
static void test_blas_threads(void)
{
    CHECK("OpenBLAS at one thread from the start", openblas_get_num_threads() == 1, "%d",
          openblas_get_num_threads());
    zt_set_threads(2);
    CHECK("zt_set_threads leaves OpenBLAS alone", openblas_get_num_threads() == 1, "%d",
          openblas_get_num_threads());
    int64_t s2[2] = { 4, 8 };
    zt_tensor *x = NULL, *w = NULL, *o = NULL;
    zt_tensor_new(&x, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, s2);
    zt_tensor_new(&w, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, s2);
    int64_t so[2] = { 4, 4 };
    zt_tensor_new(&o, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, so);
    openblas_set_num_threads(2);
    int rc = zt_matmul_forward(o, x, w, NULL);
    CHECK("a GEMM refuses to run with OpenBLAS threads changed",
          rc == ZT_ESTATE && strstr(zt_last_error(), "set it back to 1"), "rc %d msg %s", rc,
          zt_last_error());
    openblas_set_num_threads(1);
    rc = zt_matmul_forward(o, x, w, NULL);
    CHECK("and runs once it is 1 again", rc == ZT_OK, "rc %d %s", rc, zt_last_error());
    zt_tensor_release(x); zt_tensor_release(w); zt_tensor_release(o);
}

static void test_sha256(void)
{
    zt_sha256 s;
    char hex[65];
    zt_sha256_init(&s);
    zt_sha256_update(&s, "abc", 3);
    zt_sha256_hex(&s, hex);
    CHECK("sha256 abc", strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0,
          "%s", hex);
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    zt_sha256_init(&s);
    for (const char *p = m; *p; p++) zt_sha256_update(&s, p, 1);   /* byte by byte */
    zt_sha256_hex(&s, hex);
    CHECK("sha256 two-block message fed bytewise",
          strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1") == 0, "%s", hex);
    static char mil[1000000];
    memset(mil, 'a', sizeof mil);
    zt_sha256_init(&s);
    zt_sha256_update(&s, mil, sizeof mil);
    zt_sha256_hex(&s, hex);
    CHECK("sha256 million a",
          strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0, "%s", hex);
}

static void test_randn(void)
{
    int64_t s[1] = { 100001 };
    zt_tensor *a = NULL, *b = NULL;
    zt_tensor_new(&a, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, s);
    zt_tensor_new(&b, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, s);
    zt_set_threads(1);
    zt_randn(a, 42, 7, 0.0f, 2.0f);
    zt_set_threads(2);
    zt_randn(b, 42, 7, 0.0f, 2.0f);
    CHECK("randn same bits on 1 and 2 threads", memcmp(a->data, b->data, 4 * 100001) == 0, "differ");
    double m = 0, v = 0;
    const float *x = a->data;
    for (int i = 0; i < 100001; i++) { m += x[i]; v += (double)x[i] * x[i]; }
    m /= 100001; v = v / 100001 - m * m;
    CHECK("randn moments", m > -0.03 && m < 0.03 && v > 3.9 && v < 4.1, "mean %g var %g", m, v);
    zt_randn(b, 42, 8, 0.0f, 2.0f);
    CHECK("randn streams differ", memcmp(a->data, b->data, 4 * 100001) != 0, "same");
    zt_tensor_release(a); zt_tensor_release(b);
}

/* zt_adamw_segments: each segment's elements the bits of zt_adamw on that
 * segment alone (its own weight decay), elements between and after the
 * segments untouched; bad segment tables refused, nothing written */
static void test_adamw_segments(void)
{
    enum { N = 5000 };
    int64_t s[1] = { N };
    zt_tensor *t[8] = { NULL };
    for (int i = 0; i < 8; i++) zt_tensor_new(&t[i], ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, s);
    for (int i = 0; i < 4; i++) { zt_randn(t[i], 3, (uint64_t)i, 0.0f, 1.0f); }
    zt_randn(t[3], 3, 9, 1.0f, 0.1f);            /* v > 0 */
    for (int i = 0; i < 4; i++) memcpy(t[4 + i]->data, t[i]->data, 4 * N);
    int64_t off[3] = { 0, 1000, 3001 }, len[3] = { 1000, 2000, 1500 };
    float wd[3] = { 0.1f, 0.0f, 0.3f };
    int rc = zt_adamw_segments(t[0], t[1], t[2], t[3], NULL, 3, off, len, wd, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, 7);
    CHECK("adamw_segments runs", rc == ZT_OK, "%s", zt_last_error());
    for (int k = 0; k < 3; k++) {              /* the reference: zt_adamw a segment */
        zt_tensor *v[4];
        for (int i = 0; i < 4; i++) { v[i] = NULL; zt_tensor_view(&v[i], t[4 + i], off[k], 1, &len[k]); }
        zt_adamw(v[0], v[1], v[2], v[3], 1e-3f, 0.9f, 0.95f, 1e-8f, wd[k], 0.5f, 7);
        for (int i = 0; i < 4; i++) zt_tensor_release(v[i]);
    }
    CHECK("adamw_segments: param, m, v the bits of zt_adamw a segment; the gap and the tail untouched",
          !memcmp(t[0]->data, t[4]->data, 4 * N) && !memcmp(t[2]->data, t[6]->data, 4 * N) &&
          !memcmp(t[3]->data, t[7]->data, 4 * N), "differ");
    {   /* lp: the stored bf16 parameters written rounded in the same pass */
        zt_tensor *lp = NULL;
        zt_tensor_new(&lp, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_BF16, 1, s);
        uint16_t *l = lp->data, want[N];
        for (int i = 0; i < N; i++) l[i] = 0x7fc1;
        rc = zt_adamw_segments(t[0], t[1], t[2], t[3], lp, 3, off, len, wd, 1e-3f, 0.9f, 0.95f,
                               1e-8f, 0.5f, 8);
        zk_cast_f32_bf16(want, t[0]->data, N);
        long bad = 0;
        for (int i = 0; i < N; i++) {
            int in = (i < 1000) || (i >= 1000 && i < 3000) || (i >= 3001 && i < 4501);
            bad += in ? l[i] != want[i] : l[i] != 0x7fc1;
        }
        CHECK("adamw_segments with lp: each updated element rounded into lp (the cast's bits), "
              "the rest of lp untouched", rc == ZT_OK && bad == 0, "rc %d, %ld wrong", rc, bad);
        zt_tensor_release(lp);
    }
    float before[N];
    memcpy(before, t[0]->data, 4 * N);
    int64_t boff[2] = { 1000, 500 }, blen[2] = { 10, 10 };       /* out of order */
    rc = zt_adamw_segments(t[0], t[1], t[2], t[3], NULL, 2, boff, blen, wd, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 8);
    CHECK("adamw_segments refuses segments out of order", rc == ZT_EINVAL &&
          strstr(zt_last_error(), "segment 1") != NULL, "%s", zt_last_error());
    int64_t loff[1] = { 4990 }, llen[1] = { 11 };                /* past the end */
    rc = zt_adamw_segments(t[0], t[1], t[2], t[3], NULL, 1, loff, llen, wd, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 8);
    CHECK("adamw_segments refuses a segment past the end", rc == ZT_EINVAL, "%s", zt_last_error());
    rc = zt_adamw_segments(t[0], t[1], t[2], t[3], NULL, 17, off, len, wd, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 8);
    CHECK("adamw_segments refuses 17 segments", rc == ZT_EINVAL && strstr(zt_last_error(), "1 to 16"),
          "%s", zt_last_error());
    int64_t woff[1] = { 8 }, wlen[1] = { INT64_MAX - 4 };        /* offset + length wraps */
    rc = zt_adamw_segments(t[0], t[1], t[2], t[3], NULL, 1, woff, wlen, wd, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 8);
    CHECK("adamw_segments refuses a length whose end overflows", rc == ZT_EINVAL, "%s", zt_last_error());
    CHECK("refused adamw_segments wrote nothing", !memcmp(before, t[0]->data, 4 * N), "changed");
    {   /* the fused residual layer norm refuses a resid that overlaps an input */
        int64_t rs[2] = { 4, 8 }, ws[1] = { 8 }, vs[2] = { 3, 8 };
        zt_tensor *a = NULL, *b = NULL, *o = NULL, *m = NULL, *r = NULL, *w = NULL, *bi = NULL, *res = NULL;
        zt_tensor_new(&a, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, rs);
        zt_tensor_new(&b, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, vs);
        zt_tensor_new(&o, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, vs);
        zt_tensor_new(&m, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, (int64_t[]){ 3 });
        zt_tensor_new(&r, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, (int64_t[]){ 3 });
        zt_tensor_new(&w, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, ws);
        zt_tensor_new(&bi, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, ws);
        zt_tensor *a3 = NULL;
        zt_tensor_view(&a3, a, 0, 2, vs);                 /* rows 0-2 of a */
        zt_tensor_view(&res, a, 8, 2, vs);                /* rows 1-3 of a: overlaps a3 */
        rc = zt_layernorm_residual_forward(res, o, m, r, a3, b, w, bi);
        CHECK("layernorm_residual_forward refuses a resid overlapping an input (a view one row on)",
              rc == ZT_EINVAL && strstr(zt_last_error(), "overlap") != NULL, "rc %d: %s", rc,
              zt_last_error());
        zt_tensor *all[] = { a, b, o, m, r, w, bi, res, a3 };
        for (int i = 0; i < 9; i++) zt_tensor_release(all[i]);
    }
    for (int i = 0; i < 8; i++) zt_tensor_release(t[i]);
}

/* zt_sumsq_blocks_many: the partials of n zt_sumsq_blocks calls in turn;
 * tensors on two tiers refused */
static void test_sumsq_many(void)
{
    int64_t sz[3] = { 2500, 1024, 7 };
    zt_tensor *t[3] = { NULL }, *h = NULL;
    for (int i = 0; i < 3; i++) {
        zt_tensor_new(&t[i], ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, &sz[i]);
        zt_randn(t[i], 5, (uint64_t)i, 0.0f, 1.0f);
    }
    double want[8], got[8];
    int nb[3] = { 3, 1, 1 }, off = 0;
    for (int i = 0; i < 3; i++) { zt_sumsq_blocks(want + off, t[i]); off += nb[i]; }
    const zt_tensor *xs[3] = { t[0], t[1], t[2] };
    for (int i = 0; i < 8; i++) got[i] = -1;
    int rc = zt_sumsq_blocks_many(got, xs, 3);
    CHECK("sumsq_blocks_many: the partials of one call a tensor, in turn",
          rc == ZT_OK && !memcmp(got, want, 5 * sizeof(double)) && got[5] == -1, "rc %d: %s", rc,
          zt_last_error());
    zt_tensor_new(&h, ZT_TIER_HOST, ZT_CAT_OTHER, ZT_F32, 1, &sz[2]);
    const zt_tensor *mixed[2] = { t[0], h };
    rc = zt_sumsq_blocks_many(got, mixed, 2);
    CHECK("sumsq_blocks_many refuses two tiers in one call", rc == ZT_EINVAL &&
          strstr(zt_last_error(), "another tier") != NULL, "%s", zt_last_error());
    for (int i = 0; i < 3; i++) zt_tensor_release(t[i]);
    zt_tensor_release(h);
}

/* A recipe key ("device.backend", "data.seq_len") in msg: a section name
 * of the recipe, a dot, a lower-case letter. */
static const char *recipe_key_in(const char *msg)
{
    static const char *sections[] = { "model", "data", "optim", "lr", "batch", "train", "sample",
                                      "device", "comm", "launch", "pipeline", "offload", "export",
                                      "fp16", NULL };
    for (int i = 0; sections[i]; i++) {
        size_t n = strlen(sections[i]);
        for (const char *p = strstr(msg, sections[i]); p; p = strstr(p + 1, sections[i]))
            if ((p == msg || !((p[-1] >= 'a' && p[-1] <= 'z') || p[-1] == '_')) && p[n] == '.' &&
                p[n + 1] >= 'a' && p[n + 1] <= 'z')
                return p;
    }
    return NULL;
}

/* The runtime's messages name C things -- the call, its arguments, what to
 * do in C terms -- never a recipe key: the Lua caller that passed a
 * recipe's value names the key (lua/ztrain/core/ffi.lua check_key). */
static void test_messages_name_c_things(void)
{
    static const struct { const char *backend, *start; } bad[] = {
        { "cuda", "zt_device_init(\"cuda\"): built without CUDA: rebuild with make CUDA=1" },
        { "tpu", "zt_device_init(\"tpu\"): unknown device backend; known: cpu, cuda" },
        { "fakegpu-async:x", "zt_device_init(\"fakegpu-async:x\"): the seed after" },
    };
    char name[128];
    for (int i = 0; i < 3; i++) {
        int rc = zt_device_init(bad[i].backend);
        const char *e = zt_last_error(), *k = recipe_key_in(e);
        snprintf(name, sizeof name, "zt_device_init(\"%s\") names the call, no recipe key", bad[i].backend);
        CHECK(name, rc == ZT_EINVAL && strncmp(e, bad[i].start, strlen(bad[i].start)) == 0 && !k,
              "rc %d: %s (key at: %s)", rc, e, k ? k : "-");
    }
    zt_device_init("cpu");
    static const char *modes[] = { "fp8", "bf16" };
    for (int i = 0; i < 2; i++) {
        int rc = zt_device_attention(modes[i]);
        const char *e = zt_last_error(), *k = recipe_key_in(e);
        char call[40];
        snprintf(call, sizeof call, "zt_device_attention(\"%s\")", modes[i]);
        snprintf(name, sizeof name, "%s on the cpu names the call, no recipe key", call);
        CHECK(name, rc == ZT_EINVAL && strncmp(e, call, strlen(call)) == 0 && !k,
              "rc %d: %s (key at: %s)", rc, e, k ? k : "-");
    }
    {   /* tokens longer than the model's context (wpe's rows) */
        int64_t sw[2] = { 4, 8 }, st[2] = { 1, 5 }, so[3] = { 1, 5, 8 };
        zt_tensor *wte = NULL, *wpe = NULL, *tok = NULL, *out = NULL;
        zt_tensor_new(&wte, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, sw);
        zt_tensor_new(&wpe, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, sw);
        zt_tensor_new(&tok, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_I32, 2, st);
        zt_tensor_new(&out, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 3, so);
        int rc = zt_encoder_forward(out, tok, wte, wpe);
        const char *e = zt_last_error(), *k = recipe_key_in(e);
        CHECK("encoder forward: T past wpe's rows names T and wpe, no recipe key",
              rc == ZT_EINVAL && strstr(e, "T = 5 exceeds wpe's 4 positions") && !k,
              "rc %d: %s (key at: %s)", rc, e, k ? k : "-");
        st[1] = 2;
        zt_tensor *tok2 = NULL;
        zt_tensor_new(&tok2, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_I32, 2, st);
        int32_t ids[2] = { 0, 9 };
        zt_tensor_write(tok2, ids, sizeof ids);
        int64_t so2[3] = { 1, 2, 8 };
        zt_tensor *out2 = NULL;
        zt_tensor_new(&out2, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 3, so2);
        rc = zt_encoder_forward(out2, tok2, wte, wpe);
        e = zt_last_error(); k = recipe_key_in(e);
        CHECK("a token outside the vocabulary: the message has no recipe key",
              rc == ZT_EINVAL && strstr(e, "outside the vocabulary [0,4)") && !k,
              "rc %d: %s (key at: %s)", rc, e, k ? k : "-");
        zt_tensor_release(wte); zt_tensor_release(wpe); zt_tensor_release(tok);
        zt_tensor_release(out); zt_tensor_release(tok2); zt_tensor_release(out2);
    }
}

int main(void)
{
    test_tensors();
    test_limit();
    test_ops_validation();
    test_tiers();
    test_blas_threads();
    test_sha256();
    test_randn();
    test_adamw_segments();
    test_sumsq_many();
    test_messages_name_c_things();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
