/*
 * test_fakegpu.c -- runtime/device_fakegpu.c, the GPU stand-in on the CPU:
 * its device memory is not addressable by the host (a host read faults),
 * and what goes through the device table -- zt_tensor_write/read, ops,
 * copies between tiers -- has the CPU device's results. spec/e2e/fakegpu_spec.lua
 * runs the digest oracle's trainings on it.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "internal.h"     /* white-box: reads zt_tensor's fields */
#include "ctest.h"

#define CHECK(name, cond, ...) ct_check((cond), name, __VA_ARGS__)

static zt_tensor *tensor(int tier, int64_t n)
{
    zt_tensor *t = NULL;
    int rc = zt_tensor_new(&t, tier, ZT_CAT_OTHER, ZT_F32, 1, &n);
    if (rc != ZT_OK) { printf("FAIL tensor_new: %s\n", zt_last_error()); exit(1); }
    return t;
}

/* does reading p on the host kill a child process, and with which signal */
static int host_read_signal(const void *p)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        volatile float x = *(const volatile float *)p;
        (void)x;
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

int main(void)
{
    CHECK("select fakegpu", zt_device_init("fakegpu") == ZT_OK, "%s", zt_last_error());
    CHECK("its name", strcmp(zt_device_name(), "fakegpu") == 0, "%s", zt_device_name());

    const int64_t n = 1000;
    zt_tensor *d = tensor(ZT_TIER_DEVICE, n), *e = tensor(ZT_TIER_DEVICE, n);
    zt_tensor *h = tensor(ZT_TIER_HOST, n);
    int sig = host_read_signal(d->data);
    CHECK("a host read of device memory faults", sig == SIGSEGV, "signal %d", sig);
    sig = host_read_signal(h->data);
    CHECK("a host read of host memory does not", sig == 0, "signal %d", sig);

    float src[1000], back[1000];
    for (int i = 0; i < n; i++) src[i] = (float)i * 0.5f;
    CHECK("new device tensors read as zeros", zt_tensor_read(e, back, sizeof back) == ZT_OK &&
          back[0] == 0.0f && back[999] == 0.0f, "%g %g", back[0], back[999]);
    CHECK("write then read through the device", zt_tensor_write(d, src, sizeof src) == ZT_OK &&
          zt_tensor_read(d, back, sizeof back) == ZT_OK && memcmp(src, back, sizeof src) == 0,
          "%s", zt_last_error());

    /* ops on the device: e = 2 d + 1 (fill, add, scale) */
    int rc = zt_fill(e, 1.0f);
    if (rc == ZT_OK) rc = zt_add(e, d);
    if (rc == ZT_OK) rc = zt_add(e, d);
    if (rc == ZT_OK) rc = zt_tensor_read(e, back, sizeof back);
    int right = 1;
    for (int i = 0; i < n; i++) right = right && back[i] == 2.0f * src[i] + 1.0f;
    CHECK("device ops: fill, add", rc == ZT_OK && right, "rc %d, back[7] %g", rc, back[7]);
    double sum = 0;
    CHECK("sum of a device tensor", zt_sum(&sum, d) == ZT_OK && sum == 0.5 * 999 * 1000 / 2,
          "%g", sum);

    /* copies between the tiers (the device's copy takes either side) */
    rc = zt_copy_async(h, e, NULL);
    if (rc == ZT_OK) rc = zt_stream_sync(NULL);
    CHECK("device -> host copy", rc == ZT_OK && ((float *)h->data)[7] == 2.0f * src[7] + 1.0f,
          "rc %d %g", rc, ((float *)h->data)[7]);
    ((float *)h->data)[3] = -4.0f;
    rc = zt_copy_async(d, h, NULL);
    if (rc == ZT_OK) rc = zt_stream_sync(NULL);
    if (rc == ZT_OK) rc = zt_tensor_read(d, back, sizeof back);
    CHECK("host -> device copy", rc == ZT_OK && back[3] == -4.0f && back[7] == 2.0f * src[7] + 1.0f,
          "rc %d %g", rc, back[3]);
    CHECK("mixed tiers refused", zt_add(e, h) == ZT_EINVAL, "not refused");

    zt_tensor_release(d); zt_tensor_release(e); zt_tensor_release(h);
    CHECK("back to the cpu device", zt_device_init("cpu") == ZT_OK, "%s", zt_last_error());
    rc = zt_device_init("tpu");
    CHECK("an unknown backend names the known ones, fakegpu too", rc == ZT_EINVAL &&
          strstr(zt_last_error(), "zt_device_init(\"tpu\"): unknown device backend; known: cpu, cuda, fakegpu") != NULL,
          "rc %d: %s", rc, zt_last_error());
    return ct_summary();
}
