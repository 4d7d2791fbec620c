/* test_runtime.c -- tensors, views, memory accounting and limits, errors, SHA-256. */
#include <stdio.h>
#include <string.h>
#include "ztrain.h"

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
    {   /* a token outside the vocabulary must not reach the kernel's scatter */
        int64_t sv[2] = { 4, 8 }, sd[3] = { 1, 2, 8 }, st[2] = { 1, 2 };
        zt_tensor *dwte = NULL, *dwpe = NULL, *dout = NULL, *tok = NULL;
        zt_tensor_new(&dwte, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, sv);
        zt_tensor_new(&dwpe, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, sv);
        zt_tensor_new(&dout, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 3, sd);
        zt_tensor_new(&tok, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_I32, 2, st);
        ((int32_t *)tok->data)[1] = 100000000;
        rc = zt_encoder_backward(dwte, dwpe, dout, tok);
        CHECK("encoder backward rejects a token outside the vocabulary",
              rc == ZT_EINVAL && strstr(zt_last_error(), "outside the vocabulary"), "rc %d msg %s",
              rc, zt_last_error());
        zt_tensor_release(dwte); zt_tensor_release(dwpe); zt_tensor_release(dout); zt_tensor_release(tok);
    }
    rc = zt_fill(NULL, 1.0f);
    CHECK("NULL tensor is an error, not a crash", rc == ZT_EINVAL, "rc %d", rc);
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

int main(void)
{
    test_tensors();
    test_limit();
    test_ops_validation();
    test_sha256();
    test_randn();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
