/*
 * harness.c -- a libFuzzer harness that feeds each input to one of ztrain's
 * Lua readers (tools/fuzz/targets.lua) inside an embedded LuaJIT, as
 * host/main.c embeds it for the `ztrain` program.
 *
 * Built once per target with -DZT_FUZZ_TARGET="safetensors" etc. (make fuzz).
 * The Lua side calls the reader under pcall and classifies the outcome:
 *   - it returned, or raised a user error (ztrain.errors.is_user: a message
 *     without a "file.lua:N:" location), or returned nil, message: fine;
 *   - anything else (a Lua error with a location, a non-string error, a
 *     broken invariant) is a finding: printed, then abort() so libFuzzer
 *     saves the input as a crash.
 * Hangs are libFuzzer's -timeout; memory errors in C are ASan's.
 *
 * Coverage: libFuzzer instruments C, not Lua, so on its own it would mutate
 * blind. A Lua line hook feeds it Lua's: each (previous line, line) pair of
 * the interpreted code bumps a counter in __libfuzzer_extra_counters, which
 * libFuzzer reads as coverage -- an input that walks new lines of a reader
 * is kept. The JIT is off (hooks do not run in compiled traces).
 *
 * One Lua state serves every input (start-up costs ~50 ms: libztrain and
 * PCRE2 load through the FFI); a full GC every 256 inputs keeps the heap
 * from growing between them.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#ifndef ZT_FUZZ_TARGET
#error "build with -DZT_FUZZ_TARGET=\"name\" (a key of tools/fuzz/targets.lua)"
#endif

static lua_State *L;
static int run_ref = LUA_NOREF;   /* targets[ZT_FUZZ_TARGET].run */

/* Lua line-pair coverage, read by libFuzzer as extra counters. */
#define COV_SIZE (1u << 16)
__attribute__((used, section("__libfuzzer_extra_counters")))
static uint8_t lua_cov[COV_SIZE];
static uintptr_t prev_site;

/* Instruction budget per input (fuzz_budget(n) from Lua; 0 = none): user
 * code (a recipe) may loop forever, which is the user's, not a finding. */
static long budget, spent;
#define COUNT_STEP 1000

static void hook(lua_State *l, lua_Debug *ar)
{
    if (ar->event == LUA_HOOKCOUNT) {
        if (budget > 0 && (spent += COUNT_STEP) > budget) {
            budget = 0;                      /* once: let the error unwind */
            lua_pushliteral(l, "instruction limit reached (a loop that does not end?)");
            lua_error(l);
        }
        return;
    }
    if (!lua_getinfo(l, "S", ar)) return;
    /* ztrain's own files only: the lines of a fuzzed recipe (Lua code) or
     * of the harness would count every new text as new coverage */
    static const char *last_src;
    static int last_ours;
    if (ar->source != last_src) {
        last_src = ar->source;
        last_ours = strstr(ar->source, "/lua/ztrain/") != NULL;
    }
    if (!last_ours) return;
    /* the chunk's name is interned: its address identifies the file */
    uintptr_t site = (uintptr_t)ar->source * 31u + (uintptr_t)ar->currentline;
    uintptr_t h = (site ^ (prev_site >> 1)) * 0x9E3779B97F4A7C15ull;
    lua_cov[(h >> 40) & (COV_SIZE - 1)]++;
    prev_site = site;
}

static int l_budget(lua_State *l)
{
    budget = (long)luaL_optnumber(l, 1, 0);
    spent = 0;
    return 0;
}

/* The tree: ZTRAIN_HOME, else two levels above this binary (build-fuzz/). */
static void find_home(char *home, size_t n)
{
    const char *env = getenv("ZTRAIN_HOME");
    if (env && *env) { snprintf(home, n, "%s", env); return; }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) { snprintf(home, n, "."); return; }
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(home, n, "%s/..", exe);
}

static void die(const char *what)
{
    fprintf(stderr, "fuzz %s: %s\n", ZT_FUZZ_TARGET, what);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    char home[PATH_MAX], rp[PATH_MAX];
    find_home(home, sizeof home);
    if (realpath(home, rp)) snprintf(home, sizeof home, "%s", rp);

    L = luaL_newstate();
    if (!L) die("cannot create a Lua state");
    luaL_openlibs(L);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;%s/tools/fuzz/?.lua;%s", home, home, home,
                    lua_tostring(L, -1));
    lua_setfield(L, -3, "path");
    lua_pop(L, 2);
    lua_pushstring(L, home);
    lua_setglobal(L, "ZTRAIN_HOME");
    lua_pushcfunction(L, l_budget);
    lua_setglobal(L, "fuzz_budget");

    /* jit.off(): the line hook must see every line */
    luaL_dostring(L, "require('jit').off()");

    /* targets = require "targets"; run = targets.setup(name) */
    lua_getglobal(L, "require");
    lua_pushliteral(L, "targets");
    if (lua_pcall(L, 1, 1, 0) != 0) die(lua_tostring(L, -1));
    lua_getfield(L, -1, "setup");
    lua_pushstring(L, ZT_FUZZ_TARGET);
    if (lua_pcall(L, 1, 1, 0) != 0) die(lua_tostring(L, -1));
    if (!lua_isfunction(L, -1)) die("targets.setup did not return a function");
    run_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pop(L, 1);
    /* coverage from here on: set-up's lines (loading modules) are not the input's */
    lua_sethook(L, hook, LUA_MASKLINE | LUA_MASKCOUNT, COUNT_STEP);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned count;
    prev_site = 0;
    budget = spent = 0;
    lua_rawgeti(L, LUA_REGISTRYINDEX, run_ref);
    lua_pushlstring(L, (const char *)data, size);
    /* run(input) -> nil (fine) or a string (a finding). It catches the
     * reader's errors itself; an error escaping it is a finding too. */
    if (lua_pcall(L, 1, 1, 0) != 0) {
        fprintf(stderr, "fuzz %s: the harness itself failed: %s\n", ZT_FUZZ_TARGET, lua_tostring(L, -1));
        abort();
    }
    if (!lua_isnil(L, -1)) {
        fprintf(stderr, "fuzz %s: FINDING: %s\n", ZT_FUZZ_TARGET, lua_tostring(L, -1));
        abort();
    }
    lua_pop(L, 1);
    if (++count % 256 == 0) lua_gc(L, LUA_GCCOLLECT, 0);
    return 0;
}
