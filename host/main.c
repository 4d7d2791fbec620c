/*
 * main.c -- the `ztrain` program: a LuaJIT host.
 *
 * It finds the ztrain tree (ZTRAIN_HOME, else the directory above the
 * binary's build/), puts lua/ on package.path, and hands argv to
 * ztrain.cli.main. Everything else -- recipes, the REPL, options -- is Lua.
 * The runtime itself is libztrain.so, loaded by lua/ztrain/core/ffi.lua: the
 * one beside this binary unless ZTRAIN_LIB says otherwise.
 */
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

static int find_home(char *home, size_t n)
{
    const char *env = getenv("ZTRAIN_HOME");
    if (env && *env) {
        /* a wrong ZTRAIN_HOME is said as such, not as Lua's search path */
        char probe[PATH_MAX + 32];
        snprintf(probe, sizeof probe, "%s/lua/ztrain/cli/init.lua", env);
        if (access(probe, R_OK) != 0) {
            fprintf(stderr, "ztrain: ZTRAIN_HOME=%s does not hold ztrain (no readable lua/ztrain/cli/init.lua "
                            "there); unset it, or set it to the ztrain checkout\n", env);
            return 1;
        }
        snprintf(home, n, "%s", env);
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return -1;
    exe[len] = '\0';
    char self[PATH_MAX];
    snprintf(self, sizeof self, "%s", exe);
    char *dir = dirname(exe);                    /* .../build */
    snprintf(home, n, "%s/..", dir);
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/lua/ztrain/init.lua", home);
    if (access(probe, R_OK) == 0) return 0;
    snprintf(home, n, "%s", dir);
    snprintf(probe, sizeof probe, "%s/lua/ztrain/init.lua", home);
    if (access(probe, R_OK) == 0) return 0;
    /* a copied binary: said as such, not as Lua's search path */
    fprintf(stderr, "ztrain: %s is not in a ztrain tree (no readable lua/ztrain/init.lua above or beside it); "
                    "set ZTRAIN_HOME to the ztrain checkout, or run the tree's build/ztrain\n", self);
    return 1;
}

/* Does msg start with a Lua location ("path/file.lua:12: ", "repl:3: ")? As
 * ztrain.errors.located, for the common forms. */
static int is_located(const char *msg)
{
    const char *p = msg;
    while (*p && *p != ':' && *p != ' ' && *p != '\t' && *p != '\n') p++;
    if (p == msg || *p != ':' || p[1] < '0' || p[1] > '9') return 0;
    p++;
    while (*p >= '0' && *p <= '9') p++;
    return p[0] == ':' && p[1] == ' ';
}

/* Message handler for errors that escape ztrain.cli (ztrain.errors has the
 * rule): a user error -- a table with user = true, or a string without a
 * "file.lua:N:" location -- is shown as its message alone; a bug keeps its
 * location and gets a traceback. */
static int traceback(lua_State *L)
{
    if (lua_istable(L, 1)) {
        lua_getfield(L, 1, "user");
        int user = lua_toboolean(L, -1);
        lua_pop(L, 1);
        if (!luaL_callmeta(L, 1, "__tostring")) lua_pushliteral(L, "(error object is a table value)");
        if (user) return 1;
        luaL_traceback(L, L, lua_tostring(L, -1), 1);
        return 1;
    }
    const char *msg = lua_tostring(L, 1);
    if (msg && !is_located(msg)) { lua_settop(L, 1); return 1; }
    luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
    return 1;
}

/* "ztrain: MESSAGE", once: messages may already start with the name. */
static void print_error(const char *msg)
{
    if (!msg) msg = "(error object is not a string)";
    fprintf(stderr, "%s%s\n", strncmp(msg, "ztrain: ", 8) == 0 ? "" : "ztrain: ", msg);
}

/* The library beside the binary (build-cuda/ztrain -> build-cuda/
 * libztrain.so), unless ZTRAIN_LIB names one: ffi.lua's own default is the
 * tree's build/, which for a second build directory is the other build. */
static void default_lib(void)
{
    if (getenv("ZTRAIN_LIB")) return;
    char exe[PATH_MAX], lib[PATH_MAX + 16];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return;
    exe[len] = '\0';
    snprintf(lib, sizeof lib, "%s/libztrain.so", dirname(exe));
    if (access(lib, R_OK) == 0) setenv("ZTRAIN_LIB", lib, 0);
}

int main(int argc, char **argv)
{
    char home[PATH_MAX], rp[PATH_MAX];
    int hrc = find_home(home, sizeof home);
    if (hrc > 0) return 1;                   /* said why */
    if (hrc != 0) {
        fprintf(stderr, "ztrain: cannot locate the ztrain tree; set ZTRAIN_HOME\n");
        return 1;
    }
    if (realpath(home, rp)) snprintf(home, sizeof home, "%s", rp);
    default_lib();
    /* A file-size limit (ulimit -f) ends a write with EFBIG instead of
     * killing the process: the write's own error names the file, the
     * run ends with exit status 3, and its temporaries are removed
     * (docs/cli.md "Exit status"). mpirun's ranks inherit it. */
    signal(SIGXFSZ, SIG_IGN);

    lua_State *L = luaL_newstate();
    if (!L) { fprintf(stderr, "ztrain: cannot create a Lua state\n"); return 1; }
    luaL_openlibs(L);

    /* package.path: the tree's lua/ first, then the system's. */
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;%s", home, home, lua_tostring(L, -1));
    lua_setfield(L, -3, "path");
    lua_pop(L, 2);

    /* arg, as the standalone interpreter makes it: arg[0] is the program. */
    lua_createtable(L, argc, 1);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i);
    }
    lua_setglobal(L, "arg");
    lua_pushstring(L, home);
    lua_setglobal(L, "ZTRAIN_HOME");

    lua_pushcfunction(L, traceback);
    lua_getglobal(L, "require");
    lua_pushstring(L, "ztrain.cli");
    int rc = 1;
    if (lua_pcall(L, 1, 1, -3) != 0) {
        print_error(lua_tostring(L, -1));
    } else {
        lua_getfield(L, -1, "main");
        lua_getglobal(L, "arg");
        if (lua_pcall(L, 1, 1, -4) != 0) {
            print_error(lua_tostring(L, -1));
        } else {
            rc = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1) : 0;
        }
    }
    lua_close(L);
    /* What the command printed must have reached standard output (a
     * generated text is the whole result): a full disk's error is the
     * command's, exit 3 as for any failed write (docs/cli.md). */
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "ztrain: cannot write standard output%s%s\n", errno ? ": " : "",
                errno ? strerror(errno) : "");
        if (rc == 0) rc = 3;
    }
    return rc;
}
