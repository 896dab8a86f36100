/*
 * fakenvml.c - a fake libnvidia-ml.so.1 for tests without a GPU.
 *
 * Built by tests/fakenode/fakenvml.py with gcc against NVIDIA's real nvml.h (nvidia-nvml-dev wheel), with
 * -Werror=missing-prototypes: every exported function must be declared by nvml.h with the same signature,
 * so a typo in a name or a wrong struct is a compile error, not a silent mismatch.
 *
 * State: a line-based "key = value" file, located by $FAKE_NVML_STATE, else "fakenvml.state" next to this
 * .so (dladdr).  It is re-read whenever it changes (inode/size/mtime), so tests may edit it between calls.
 * Keys are documented in tests/fakenode/README.md.  Fault injection, most specific first:
 *   crash.<fn>.<gpu|*> = 1     abort() the process
 *   hang.<fn>.<gpu|*> = 1      block forever (the caller must kill the process)
 *   delay_ms.<fn>.<gpu|*> = N  sleep N ms, then continue
 *   fault.<fn>.<gpu|*> = code  return that nvmlReturn_t
 * <fn> is the exported name (nvmlDeviceGetCount_v2) or its base name (nvmlDeviceGetCount; nvmlInit covers
 * nvmlInit_v2 and nvmlInitWithFlags); "<kind>.*.<gpu>" hits every call on that GPU.  A value of 0 for a more
 * specific key cancels a less specific one.
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>

#include <ctype.h>
#include <fcntl.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAX_GPUS 128 /* bench/ builds 72-GPU (NVL72-sized) nodes */

struct nvmlDevice_st {
    unsigned int index;
};
static struct nvmlDevice_st g_devs[FAKE_MAX_GPUS];

typedef struct {
    const char *key;
    const char *val;
    size_t line;
} kv_t;

typedef struct {
    kv_t *kv;
    size_t n;
    char *text;
} state_t;

/* Old states are never freed: a reader may still hold one; reloads are rare (a test edit). */
static state_t *g_state;
static char g_path[4096];
static struct stat g_stat;
static int g_init_refs;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* ------------------------------------------------------------------------------------------ state */

static void debug(const char *fmt, ...) {
    if (!getenv("FAKE_NVML_DEBUG")) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("fakenvml: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void locate_state(void) {
    const char *env = getenv("FAKE_NVML_STATE");
    Dl_info info;
    if (env && *env) {
        snprintf(g_path, sizeof g_path, "%s", env);
    } else if (dladdr((void *)&locate_state, &info) && info.dli_fname) {
        snprintf(g_path, sizeof g_path, "%s", info.dli_fname);
        char *slash = strrchr(g_path, '/');
        size_t off = slash ? (size_t)(slash - g_path + 1) : 0;
        snprintf(g_path + off, sizeof g_path - off, "fakenvml.state");
    } else {
        snprintf(g_path, sizeof g_path, "fakenvml.state");
    }
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

static int kv_cmp(const void *a, const void *b) {
    const kv_t *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->line < y->line ? -1 : x->line > y->line);
}

static int load_state(void) {
    FILE *f = fopen(g_path, "rb");
    if (!f) return -1;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return -1;
    }
    state_t *s = calloc(1, sizeof *s);
    s->text = malloc((size_t)st.st_size + 1);
    size_t len = fread(s->text, 1, (size_t)st.st_size, f);
    fclose(f);
    s->text[len] = '\0';
    size_t cap = 1;
    for (size_t i = 0; i < len; i++) cap += s->text[i] == '\n';
    s->kv = calloc(cap, sizeof *s->kv);
    char *save = NULL, *line = strtok_r(s->text, "\n", &save);
    for (size_t no = 0; line; line = strtok_r(NULL, "\n", &save), no++) {
        char *eq = strchr(line, '=');
        char *k = trim(line);
        if (!*k || *k == '#' || !eq) continue;
        *eq = '\0';
        s->kv[s->n].key = trim(k);
        s->kv[s->n].val = trim(eq + 1);
        s->kv[s->n].line = no;
        s->n++;
    }
    qsort(s->kv, s->n, sizeof *s->kv, kv_cmp);
    __atomic_store_n(&g_state, s, __ATOMIC_RELEASE);
    g_stat = st;
    debug("loaded %zu keys from %s", s->n, g_path);
    return 0;
}

/* Reload when the file changed; returns 0 when a state is available. */
static int refresh(void) {
    struct stat st;
    int rc = 0;
    pthread_mutex_lock(&g_lock);
    if (stat(g_path, &st) != 0) {
        rc = g_state ? 0 : -1;
    } else if (!g_state || st.st_ino != g_stat.st_ino || st.st_dev != g_stat.st_dev ||
               st.st_size != g_stat.st_size || st.st_mtim.tv_sec != g_stat.st_mtim.tv_sec ||
               st.st_mtim.tv_nsec != g_stat.st_mtim.tv_nsec) {
        rc = load_state();
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

static const char *lookup(const char *key) {
    state_t *s = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
    if (!s || !s->n) return NULL;
    size_t lo = 0, hi = s->n;
    while (lo < hi) { /* first entry >= key */
        size_t mid = (lo + hi) / 2;
        if (strcmp(s->kv[mid].key, key) < 0) lo = mid + 1; else hi = mid;
    }
    const char *val = NULL;
    for (; lo < s->n && strcmp(s->kv[lo].key, key) == 0; lo++) val = s->kv[lo].val; /* last wins */
    return val;
}

static const char *vget(const char *fmt, va_list ap) {
    char key[512];
    vsnprintf(key, sizeof key, fmt, ap);
    return lookup(key);
}

static const char *get(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const char *v = vget(fmt, ap);
    va_end(ap);
    return v;
}

static unsigned long long to_ull(const char *v, unsigned long long dflt) {
    if (!v || !*v) return dflt;
    if (!strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) return 1;
    if (!strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off")) return 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 0);
    return end == v ? dflt : x;
}

/* gpu.<idx>.<fmt> as integer / string */
static unsigned long long G(int idx, unsigned long long dflt, const char *fmt, ...) {
    char key[512];
    va_list ap;
    int n = snprintf(key, sizeof key, "gpu.%d.", idx);
    va_start(ap, fmt);
    vsnprintf(key + n, sizeof key - (size_t)n, fmt, ap);
    va_end(ap);
    return to_ull(lookup(key), dflt);
}

static const char *GS(int idx, const char *dflt, const char *fmt, ...) {
    char key[512];
    va_list ap;
    int n = snprintf(key, sizeof key, "gpu.%d.", idx);
    va_start(ap, fmt);
    vsnprintf(key + n, sizeof key - (size_t)n, fmt, ap);
    va_end(ap);
    const char *v = lookup(key);
    return v ? v : dflt;
}

static unsigned int gpu_count(void) {
    unsigned long long n = to_ull(get("gpu.count"), 0);
    return n > FAKE_MAX_GPUS ? FAKE_MAX_GPUS : (unsigned int)n;
}

/* ------------------------------------------------------------------------------------------ faults */

static const char *injected(const char *kind, const char *fn, const char *base, int gpu) {
    const char *names[2] = {fn, base};
    const char *v;
    for (int i = 0; i < 2; i++)
        if (gpu >= 0 && (v = get("%s.%s.%d", kind, names[i], gpu))) return v;
    for (int i = 0; i < 2; i++)
        if ((v = get("%s.%s.*", kind, names[i])) || (v = get("%s.%s", kind, names[i]))) return v;
    if (gpu >= 0 && (v = get("%s.*.%d", kind, gpu))) return v;
    return get("%s.*.*", kind);
}

static nvmlReturn_t inject(const char *fn, const char *base, int gpu) {
    if (to_ull(injected("crash", fn, base, gpu), 0)) {
        debug("crash injected in %s (gpu %d)", fn, gpu);
        abort();
    }
    if (to_ull(injected("hang", fn, base, gpu), 0)) {
        debug("hang injected in %s (gpu %d)", fn, gpu);
        for (;;) sleep(1000);
    }
    unsigned long long ms = to_ull(injected("delay_ms", fn, base, gpu), 0);
    if (ms) {
        struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    return (nvmlReturn_t)to_ull(injected("fault", fn, base, gpu), NVML_SUCCESS);
}

/* $FAKE_NVML_CALL_LOG: every call's base name appended to that file, one line each (O_APPEND: the
 * processes of one hook share it), so a test can count what a whole prolog asked NVML. */
static int g_call_log = -1;
static pthread_once_t g_call_log_once = PTHREAD_ONCE_INIT;

static void open_call_log(void) {
    const char *path = getenv("FAKE_NVML_CALL_LOG");
    if (path && *path) g_call_log = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
}

static void log_call(const char *base) {
    pthread_once(&g_call_log_once, open_call_log);
    if (g_call_log < 0) return;
    char line[128];
    int n = snprintf(line, sizeof line, "%s\n", base);
    if (n > 0 && (size_t)n < sizeof line && write(g_call_log, line, (size_t)n) < 0) {
    }
}

static nvmlReturn_t enter_sys(const char *fn, const char *base) {
    log_call(base);
    if (refresh() != 0 || !g_init_refs) return NVML_ERROR_UNINITIALIZED;
    return inject(fn, base, -1);
}

static int dev_index(nvmlDevice_t d) {
    uintptr_t p = (uintptr_t)d, b = (uintptr_t)&g_devs[0];
    if (!d || p < b || p >= b + sizeof g_devs || (p - b) % sizeof g_devs[0]) return -1;
    unsigned int i = (unsigned int)((p - b) / sizeof g_devs[0]);
    return i < gpu_count() ? (int)i : -1;
}

static nvmlReturn_t enter_dev(const char *fn, const char *base, nvmlDevice_t d, int *idx) {
    log_call(base);
    if (refresh() != 0 || !g_init_refs) return NVML_ERROR_UNINITIALIZED;
    *idx = dev_index(d);
    if (*idx < 0) return NVML_ERROR_INVALID_ARGUMENT;
    return inject(fn, base, *idx);
}

#define SYS_ENTER(BASE)                                                   \
    do {                                                                  \
        nvmlReturn_t r_ = enter_sys(__func__, BASE);                      \
        if (r_ != NVML_SUCCESS) return r_;                                \
    } while (0)

#define DEV_ENTER(BASE, DEVICE)                                           \
    int idx = -1;                                                         \
    do {                                                                  \
        nvmlReturn_t r_ = enter_dev(__func__, BASE, DEVICE, &idx);        \
        if (r_ != NVML_SUCCESS) return r_;                                \
    } while (0)

#define NEED(PTR)                                                         \
    do {                                                                  \
        if (!(PTR)) return NVML_ERROR_INVALID_ARGUMENT;                   \
    } while (0)

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src) {
    NEED(dst);
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ init */

static nvmlReturn_t do_init(const char *fn) {
    locate_state();
    pthread_mutex_lock(&g_lock);
    int rc = load_state();
    pthread_mutex_unlock(&g_lock);
    if (rc != 0) {
        debug("state file %s not readable", g_path);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    nvmlReturn_t r = inject(fn, "nvmlInit", -1);
    if (r != NVML_SUCCESS) return r;
    if (!to_ull(get("driver_loaded"), 1)) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (unsigned int i = 0; i < FAKE_MAX_GPUS; i++) g_devs[i].index = i;
    pthread_mutex_lock(&g_lock);
    g_init_refs++;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return do_init(__func__); }
nvmlReturn_t nvmlInit(void) { return do_init(__func__); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init(__func__); }

nvmlReturn_t nvmlShutdown(void) {
    if (refresh() == 0) {
        nvmlReturn_t r = inject(__func__, "nvmlShutdown", -1);
        if (r != NVML_SUCCESS) return r;
    }
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = g_init_refs ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_init_refs) g_init_refs--;
    pthread_mutex_unlock(&g_lock);
    return r;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

/* ------------------------------------------------------------------------------------------ system */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    SYS_ENTER("nvmlSystemGetDriverVersion");
    const char *v = get("driver_version");
    return copy_str(version, length, v ? v : "550.54.15");
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    SYS_ENTER("nvmlSystemGetNVMLVersion");
    const char *v = get("nvml_version");
    return copy_str(version, length, v ? v : "12.999.99-fakenvml");
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    SYS_ENTER("nvmlSystemGetCudaDriverVersion");
    NEED(cudaDriverVersion);
    *cudaDriverVersion = (int)to_ull(get("cuda_driver_version"), 12040);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    SYS_ENTER("nvmlSystemGetCudaDriverVersion");
    NEED(cudaDriverVersion);
    *cudaDriverVersion = (int)to_ull(get("cuda_driver_version"), 12040);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    SYS_ENTER("nvmlSystemGetProcessName");
    const char *v = get("process.%u.name", pid);
    if (!v) return NVML_ERROR_NOT_FOUND;
    return copy_str(name, length, v);
}

static nvmlReturn_t get_count(unsigned int *deviceCount) {
    NEED(deviceCount);
    *deviceCount = gpu_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    SYS_ENTER("nvmlDeviceGetCount");
    return get_count(deviceCount);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
    SYS_ENTER("nvmlDeviceGetCount");
    return get_count(deviceCount);
}

static nvmlReturn_t handle_for(const char *fn, const char *base, int i, nvmlDevice_t *device) {
    nvmlReturn_t r = inject(fn, base, i);
    if (r != NVML_SUCCESS) return r;
    *device = &g_devs[i];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (refresh() != 0 || !g_init_refs) return NVML_ERROR_UNINITIALIZED;
    NEED(device);
    if (index >= gpu_count()) return NVML_ERROR_INVALID_ARGUMENT;
    return handle_for(__func__, "nvmlDeviceGetHandleByIndex", (int)index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    if (refresh() != 0 || !g_init_refs) return NVML_ERROR_UNINITIALIZED;
    NEED(device);
    if (index >= gpu_count()) return NVML_ERROR_INVALID_ARGUMENT;
    return handle_for(__func__, "nvmlDeviceGetHandleByIndex", (int)index, device);
}

/* "0000:18:00.0", "00000000:18:00.0", "18:00.0" (any case) -> domain/bus/device/function */
static int parse_bus_id(const char *s, unsigned int *dom, unsigned int *bus, unsigned int *dev, unsigned int *fn) {
    unsigned int a, b, c, d;
    if (sscanf(s, "%x:%x:%x.%x", &a, &b, &c, &d) == 4) {
        *dom = a; *bus = b; *dev = c; *fn = d;
        return 0;
    }
    if (sscanf(s, "%x:%x.%x", &b, &c, &d) == 3) {
        *dom = 0; *bus = b; *dev = c; *fn = d;
        return 0;
    }
    return -1;
}

static nvmlReturn_t by_bus_id(const char *fn, const char *pciBusId, nvmlDevice_t *device) {
    if (refresh() != 0 || !g_init_refs) return NVML_ERROR_UNINITIALIZED;
    NEED(pciBusId);
    NEED(device);
    unsigned int d0, b0, v0, f0, d1, b1, v1, f1;
    if (parse_bus_id(pciBusId, &d0, &b0, &v0, &f0)) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < gpu_count(); i++) {
        if (!parse_bus_id(GS((int)i, "", "pci"), &d1, &b1, &v1, &f1) && d0 == d1 && b0 == b1 && v0 == v1 &&
            f0 == f1)
            return handle_for(fn, "nvmlDeviceGetHandleByPciBusId", (int)i, device);
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    return by_bus_id(__func__, pciBusId, device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) {
    return by_bus_id(__func__, pciBusId, device);
}

static nvmlReturn_t by_string(const char *fn, const char *key, const char *want, nvmlDevice_t *device) {
    if (refresh() != 0 || !g_init_refs) return NVML_ERROR_UNINITIALIZED;
    NEED(want);
    NEED(device);
    for (unsigned int i = 0; i < gpu_count(); i++)
        if (!strcmp(GS((int)i, "", "%s", key), want)) return handle_for(fn, fn, (int)i, device);
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return by_string(__func__, "uuid", uuid, device);
}

nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) {
    return by_string(__func__, "serial", serial, device);
}

/* ------------------------------------------------------------------------------------------ identity */

#define DEV_STRING(FN, KEY, DFLT)                                         \
    nvmlReturn_t FN(nvmlDevice_t device, char *out, unsigned int length) { \
        DEV_ENTER(#FN, device);                                           \
        return copy_str(out, length, GS(idx, DFLT, KEY));                 \
    }

DEV_STRING(nvmlDeviceGetName, "name", "NVIDIA H100 80GB HBM3")
DEV_STRING(nvmlDeviceGetUUID, "uuid", "")
DEV_STRING(nvmlDeviceGetSerial, "serial", "")
DEV_STRING(nvmlDeviceGetVbiosVersion, "vbios", "96.00.74.00.01")
DEV_STRING(nvmlDeviceGetBoardPartNumber, "board_part_number", "")
DEV_STRING(nvmlDeviceGetInforomImageVersion, "inforom_image", "")

#define DEV_UINT(FN, TYPE, EXPR)                                          \
    nvmlReturn_t FN(nvmlDevice_t device, TYPE *out) {                     \
        DEV_ENTER(#FN, device);                                           \
        NEED(out);                                                        \
        *out = (TYPE)(EXPR);                                              \
        return NVML_SUCCESS;                                              \
    }

DEV_UINT(nvmlDeviceGetIndex, unsigned int, idx)
DEV_UINT(nvmlDeviceGetMinorNumber, unsigned int, G(idx, (unsigned)idx, "minor_number"))
DEV_UINT(nvmlDeviceGetPersistenceMode, nvmlEnableState_t, G(idx, 1, "persistence_mode"))
DEV_UINT(nvmlDeviceGetComputeMode, nvmlComputeMode_t, G(idx, 0, "compute_mode"))
DEV_UINT(nvmlDeviceGetArchitecture, nvmlDeviceArchitecture_t, G(idx, NVML_DEVICE_ARCH_HOPPER, "architecture"))
DEV_UINT(nvmlDeviceGetBrand, nvmlBrandType_t, G(idx, 14, "brand"))
DEV_UINT(nvmlDeviceGetPerformanceState, nvmlPstates_t, G(idx, 0, "pstate"))
DEV_UINT(nvmlDeviceGetDisplayMode, nvmlEnableState_t, G(idx, 0, "display_mode"))
DEV_UINT(nvmlDeviceGetDisplayActive, nvmlEnableState_t, G(idx, 0, "display_active"))
DEV_UINT(nvmlDeviceGetPowerUsage, unsigned int, G(idx, 70000, "power.usage_mw"))
DEV_UINT(nvmlDeviceGetTotalEnergyConsumption, unsigned long long, G(idx, 0, "power.energy_mj"))
DEV_UINT(nvmlDeviceGetPcieReplayCounter, unsigned int, G(idx, 0, "pcie.replay_counter"))
DEV_UINT(nvmlDeviceGetCurrPcieLinkGeneration, unsigned int, G(idx, 5, "pcie.gen"))
DEV_UINT(nvmlDeviceGetMaxPcieLinkGeneration, unsigned int, G(idx, 5, "pcie.max_gen"))
DEV_UINT(nvmlDeviceGetGpuMaxPcieLinkGeneration, unsigned int, G(idx, 5, "pcie.gpu_max_gen"))
DEV_UINT(nvmlDeviceGetCurrPcieLinkWidth, unsigned int, G(idx, 16, "pcie.width"))
DEV_UINT(nvmlDeviceGetMaxPcieLinkWidth, unsigned int, G(idx, 16, "pcie.max_width"))
DEV_UINT(nvmlDeviceGetPcieLinkMaxSpeed, unsigned int, G(idx, 32000, "pcie.max_speed"))
DEV_UINT(nvmlDeviceGetPcieSpeed, unsigned int, G(idx, 32000, "pcie.speed"))
DEV_UINT(nvmlDeviceGetCurrentClocksEventReasons, unsigned long long, G(idx, 0, "clocks_event_reasons"))
DEV_UINT(nvmlDeviceGetCurrentClocksThrottleReasons, unsigned long long, G(idx, 0, "clocks_event_reasons"))
DEV_UINT(nvmlDeviceGetSupportedClocksEventReasons, unsigned long long,
         G(idx, 0x1FF, "supported_clocks_event_reasons"))
DEV_UINT(nvmlDeviceGetSupportedClocksThrottleReasons, unsigned long long,
         G(idx, 0x1FF, "supported_clocks_event_reasons"))
DEV_UINT(nvmlDeviceGetBoardId, unsigned int, G(idx, 0x1800 + (unsigned)idx, "board_id"))
DEV_UINT(nvmlDeviceGetMultiGpuBoard, unsigned int, G(idx, 0, "multi_gpu_board"))

static void fill_pci(int idx, unsigned int *dom, unsigned int *bus, unsigned int *dev, char *busId, size_t idlen,
                     char *legacy, size_t leglen) {
    unsigned int d = 0, b = 0, v = 0, f = 0;
    parse_bus_id(GS(idx, "0000:00:00.0", "pci"), &d, &b, &v, &f);
    *dom = d; *bus = b; *dev = v;
    snprintf(busId, idlen, NVML_DEVICE_PCI_BUS_ID_FMT, d, b, v);
    if (legacy) snprintf(legacy, leglen, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, d, b, v);
}

static unsigned int pci_device_id(int idx) {
    return (unsigned int)((G(idx, 0x2330, "pci_device_id") << 16) | G(idx, 0x10DE, "pci_vendor_id"));
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV_ENTER("nvmlDeviceGetPciInfo", device);
    NEED(pci);
    memset(pci, 0, sizeof *pci);
    fill_pci(idx, &pci->domain, &pci->bus, &pci->device, pci->busId, sizeof pci->busId, pci->busIdLegacy,
             sizeof pci->busIdLegacy);
    pci->pciDeviceId = pci_device_id(idx);
    pci->pciSubSystemId = (unsigned int)G(idx, 0x16C110DE, "pci_subsystem_id");
    return NVML_SUCCESS;
}

/* The legacy entry points the real library still exports (nvml.h declares them under
 * NVML_NO_UNVERSIONED_FUNC_DEFS; libnvidia-ml 580.159.04 exports nvmlDeviceGetPciInfo, seen in
 * tests/captures/device/h200-vm/nvml-calls.json). _v2 has today's layout. The first version's
 * struct is a prefix of it: the 16-byte bus id, domain, bus, device, the two ids, then 16 reserved
 * bytes in place of the 32-byte busId; an old caller's buffer is only that long, so only that is written. */
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    nvmlPciInfo_t full;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = nvmlDeviceGetPciInfo_v3(device, &full);
    if (r != NVML_SUCCESS) return r;
    size_t prefix = offsetof(nvmlPciInfo_t, busId);
    memcpy(pci, &full, prefix);
    memset((char *)pci + prefix, 0, 16);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci) {
    DEV_ENTER("nvmlDeviceGetPciInfoExt", device);
    NEED(pci);
    if (pci->version != nvmlPciInfoExt_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    fill_pci(idx, &pci->domain, &pci->bus, &pci->device, pci->busId, sizeof pci->busId, NULL, 0);
    pci->pciDeviceId = pci_device_id(idx);
    pci->pciSubSystemId = (unsigned int)G(idx, 0x16C110DE, "pci_subsystem_id");
    unsigned int cls = (unsigned int)G(idx, 0x030200, "pci_class");
    pci->baseClass = cls >> 16;
    pci->subClass = (cls >> 8) & 0xFF;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    DEV_ENTER("nvmlDeviceGetCudaComputeCapability", device);
    NEED(major);
    NEED(minor);
    if (sscanf(GS(idx, "9.0", "cuda_cc"), "%d.%d", major, minor) != 2) return NVML_ERROR_UNKNOWN;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    DEV_ENTER("nvmlDeviceGetMigMode", device);
    NEED(currentMode);
    NEED(pendingMode);
    if (!G(idx, 1, "mig.supported")) return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = (unsigned int)G(idx, 0, "mig.current");
    *pendingMode = (unsigned int)G(idx, 0, "mig.pending");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    DEV_ENTER("nvmlDeviceGetFanSpeed", device);
    NEED(speed);
    if (!GS(idx, NULL, "fan_speed")) return NVML_ERROR_NOT_SUPPORTED; /* SXM boards have no fan */
    *speed = (unsigned int)G(idx, 0, "fan_speed");
    return NVML_SUCCESS;
}


/* ------------------------------------------------------------------------------------------ ECC, memory health */

static const char *LOCATIONS[] = {"l1", "l2", "dram", "register_file", "texture", "texture_shm", "cbu", "sram"};
#define N_LOCATIONS (sizeof LOCATIONS / sizeof LOCATIONS[0])

static int location_supported(int idx, unsigned int loc) {
    const char *list = GS(idx, "dram,sram", "ecc.locations");
    size_t n = strlen(LOCATIONS[loc]);
    for (const char *p = list; (p = strstr(p, LOCATIONS[loc])) != NULL; p += n) {
        int start = p == list || p[-1] == ',' || p[-1] == ' ';
        int end = p[n] == '\0' || p[n] == ',' || p[n] == ' ';
        if (start && end) return 1;
    }
    return 0;
}

static const char *ecc_counter_name(nvmlEccCounterType_t c) { return c == NVML_AGGREGATE_ECC ? "aggregate" : "volatile"; }
static const char *ecc_error_name(nvmlMemoryErrorType_t e) {
    return e == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? "uncorrected" : "corrected";
}

static nvmlReturn_t ecc_args(int idx, nvmlMemoryErrorType_t e, nvmlEccCounterType_t c) {
    if (e > NVML_MEMORY_ERROR_TYPE_UNCORRECTED || c > NVML_AGGREGATE_ECC) return NVML_ERROR_INVALID_ARGUMENT;
    if (!G(idx, 1, "ecc.supported") || !G(idx, 1, "ecc.mode")) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending) {
    DEV_ENTER("nvmlDeviceGetEccMode", device);
    NEED(current);
    NEED(pending);
    if (!G(idx, 1, "ecc.supported")) return NVML_ERROR_NOT_SUPPORTED;
    *current = (nvmlEnableState_t)G(idx, 1, "ecc.mode");
    *pending = (nvmlEnableState_t)G(idx, *current, "ecc.pending");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDefaultEccMode(nvmlDevice_t device, nvmlEnableState_t *defaultMode) {
    DEV_ENTER("nvmlDeviceGetDefaultEccMode", device);
    NEED(defaultMode);
    if (!G(idx, 1, "ecc.supported")) return NVML_ERROR_NOT_SUPPORTED;
    *defaultMode = (nvmlEnableState_t)G(idx, 1, "ecc.default");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    DEV_ENTER("nvmlDeviceGetTotalEccErrors", device);
    NEED(eccCounts);
    nvmlReturn_t r = ecc_args(idx, errorType, counterType);
    if (r != NVML_SUCCESS) return r;
    unsigned long long sum = 0;
    for (unsigned int loc = 0; loc < N_LOCATIONS; loc++)
        sum += G(idx, 0, "ecc.%s.%s.%s", ecc_counter_name(counterType), ecc_error_name(errorType), LOCATIONS[loc]);
    *eccCounts = sum;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                             nvmlEccCounterType_t counterType, nvmlMemoryLocation_t locationType,
                                             unsigned long long *count) {
    DEV_ENTER("nvmlDeviceGetMemoryErrorCounter", device);
    NEED(count);
    nvmlReturn_t r = ecc_args(idx, errorType, counterType);
    if (r != NVML_SUCCESS) return r;
    if ((unsigned int)locationType >= N_LOCATIONS) return NVML_ERROR_INVALID_ARGUMENT;
    if (!location_supported(idx, locationType)) return NVML_ERROR_NOT_SUPPORTED;
    *count = G(idx, 0, "ecc.%s.%s.%s", ecc_counter_name(counterType), ecc_error_name(errorType),
               LOCATIONS[locationType]);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    DEV_ENTER("nvmlDeviceGetRemappedRows", device);
    NEED(corrRows && uncRows && isPending && failureOccurred);
    if (!G(idx, 1, "remapped_rows.supported")) return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = (unsigned int)G(idx, 0, "remapped_rows.corrected");
    *uncRows = (unsigned int)G(idx, 0, "remapped_rows.uncorrected");
    *isPending = (unsigned int)G(idx, 0, "remapped_rows.pending");
    *failureOccurred = (unsigned int)G(idx, 0, "remapped_rows.failure");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows_v2(nvmlDevice_t device, nvmlRemappedRowsInfo_v2_t *info) {
    DEV_ENTER("nvmlDeviceGetRemappedRows", device);
    NEED(info);
    if (!G(idx, 1, "remapped_rows.supported")) return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->corrActiveRemaps = (unsigned int)G(idx, 0, "remapped_rows.corrected");
    info->uncActiveRemaps = (unsigned int)G(idx, 0, "remapped_rows.uncorrected");
    info->bPending = (unsigned int)G(idx, 0, "remapped_rows.pending");
    info->bFailureOccurred = (unsigned int)G(idx, 0, "remapped_rows.failure");
    return NVML_SUCCESS;
}

/* comma-separated list of numbers (hex or decimal) -> count, optionally stored */
static unsigned int parse_list(const char *s, unsigned long long *out, unsigned int cap) {
    unsigned int n = 0;
    while (s && *s) {
        char *end;
        unsigned long long v = strtoull(s, &end, 0);
        if (end == s) { s++; continue; }
        if (out && n < cap) out[n] = v;
        n++;
        s = end;
    }
    return n;
}

static nvmlReturn_t retired(const char *fn, nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                            unsigned int *pageCount, unsigned long long *addresses, unsigned long long *timestamps) {
    int idx = -1;
    nvmlReturn_t r = enter_dev(fn, "nvmlDeviceGetRetiredPages", device, &idx);
    if (r != NVML_SUCCESS) return r;
    NEED(pageCount);
    if (cause > NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR) return NVML_ERROR_INVALID_ARGUMENT;
    if (!G(idx, 0, "retired_pages.supported")) return NVML_ERROR_NOT_SUPPORTED;
    const char *list = GS(idx, "", cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR ?
                          "retired_pages.double_bit" : "retired_pages.single_bit");
    unsigned int n = parse_list(list, NULL, 0), cap = *pageCount;
    *pageCount = n;
    if (n == 0) return NVML_SUCCESS;
    if (!addresses || cap < n) return NVML_ERROR_INSUFFICIENT_SIZE;
    parse_list(list, addresses, n);
    for (unsigned int i = 0; timestamps && i < n; i++) timestamps[i] = 1700000000ULL + i;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                       unsigned int *pageCount, unsigned long long *addresses) {
    return retired(__func__, device, cause, pageCount, addresses, NULL);
}

nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                          unsigned int *pageCount, unsigned long long *addresses,
                                          unsigned long long *timestamps) {
    return retired(__func__, device, cause, pageCount, addresses, timestamps);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) {
    DEV_ENTER("nvmlDeviceGetRetiredPagesPendingStatus", device);
    NEED(isPending);
    if (!G(idx, 0, "retired_pages.supported")) return NVML_ERROR_NOT_SUPPORTED;
    *isPending = (nvmlEnableState_t)G(idx, 0, "retired_pages.pending");
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ power, clocks, thermal */

static nvmlReturn_t power_value(int idx, const char *key, unsigned long long dflt, unsigned int *out) {
    NEED(out);
    if (!G(idx, 1, "power.management")) return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned int)G(idx, dflt, "power.%s", key);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_ENTER("nvmlDeviceGetPowerManagementLimit", device);
    return power_value(idx, "limit_mw", 700000, limit);
}

nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *defaultLimit) {
    DEV_ENTER("nvmlDeviceGetPowerManagementDefaultLimit", device);
    return power_value(idx, "default_limit_mw", 700000, defaultLimit);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_ENTER("nvmlDeviceGetEnforcedPowerLimit", device);
    return power_value(idx, "enforced_limit_mw", 700000, limit);
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *minLimit,
                                                          unsigned int *maxLimit) {
    DEV_ENTER("nvmlDeviceGetPowerManagementLimitConstraints", device);
    nvmlReturn_t r = power_value(idx, "min_limit_mw", 200000, minLimit);
    return r != NVML_SUCCESS ? r : power_value(idx, "max_limit_mw", 700000, maxLimit);
}

static const char *CLOCK_NAMES[] = {"graphics", "sm", "mem", "video"};

static nvmlReturn_t clock_value(int idx, const char *table, nvmlClockType_t type, unsigned int *out) {
    NEED(out);
    if ((unsigned int)type > NVML_CLOCK_VIDEO) return NVML_ERROR_INVALID_ARGUMENT;
    const char *v = GS(idx, NULL, "%s.%s", table, CLOCK_NAMES[type]);
    if (!v) return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned int)to_ull(v, 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    DEV_ENTER("nvmlDeviceGetClockInfo", device);
    return clock_value(idx, "clocks", type, clock);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    DEV_ENTER("nvmlDeviceGetMaxClockInfo", device);
    return clock_value(idx, "max_clocks", type, clock);
}

nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType, unsigned int *clockMHz) {
    DEV_ENTER("nvmlDeviceGetApplicationsClock", device);
    return clock_value(idx, "applications_clocks", clockType, clockMHz);
}

nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                                   unsigned int *clockMHz) {
    DEV_ENTER("nvmlDeviceGetDefaultApplicationsClock", device);
    return clock_value(idx, "default_applications_clocks", clockType, clockMHz);
}

nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t clockType, nvmlClockId_t clockId,
                                unsigned int *clockMHz) {
    DEV_ENTER("nvmlDeviceGetClock", device);
    switch (clockId) {
    case NVML_CLOCK_ID_CURRENT: return clock_value(idx, "clocks", clockType, clockMHz);
    case NVML_CLOCK_ID_APP_CLOCK_TARGET: return clock_value(idx, "applications_clocks", clockType, clockMHz);
    case NVML_CLOCK_ID_APP_CLOCK_DEFAULT: return clock_value(idx, "default_applications_clocks", clockType, clockMHz);
    case NVML_CLOCK_ID_CUSTOMER_BOOST_MAX: return clock_value(idx, "max_clocks", clockType, clockMHz);
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp) {
    DEV_ENTER("nvmlDeviceGetTemperature", device);
    NEED(temp);
    if (sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = (unsigned int)G(idx, 33, "temperature.gpu");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    DEV_ENTER("nvmlDeviceGetTemperature", device);
    NEED(temperature);
    if (temperature->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    temperature->temperature = (int)G(idx, 33, "temperature.gpu");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t thresholdType,
                                               unsigned int *temp) {
    DEV_ENTER("nvmlDeviceGetTemperatureThreshold", device);
    NEED(temp);
    const char *key;
    switch (thresholdType) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: key = "shutdown"; break;
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: key = "slowdown"; break;
    case NVML_TEMPERATURE_THRESHOLD_MEM_MAX: key = "mem_max"; break;
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: key = "gpu_max"; break;
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
    const char *v = GS(idx, NULL, "temperature.%s", key);
    if (!v) return NVML_ERROR_NOT_SUPPORTED;
    *temp = (unsigned int)to_ull(v, 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    DEV_ENTER("nvmlDeviceGetUtilizationRates", device);
    NEED(utilization);
    utilization->gpu = (unsigned int)G(idx, 0, "utilization.gpu");
    utilization->memory = (unsigned int)G(idx, 0, "utilization.memory");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t perfPolicyType,
                                          nvmlViolationTime_t *violTime) {
    DEV_ENTER("nvmlDeviceGetViolationStatus", device);
    NEED(violTime);
    static const char *names[] = {"power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability"};
    if ((unsigned int)perfPolicyType >= sizeof names / sizeof names[0]) return NVML_ERROR_NOT_SUPPORTED;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    violTime->referenceTime = (unsigned long long)tv.tv_sec * 1000000ULL + (unsigned long long)tv.tv_usec;
    violTime->violationTime = G(idx, 0, "violation_ns.%s", names[perfPolicyType]);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ memory, processes */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEV_ENTER("nvmlDeviceGetMemoryInfo", device);
    NEED(memory);
    unsigned long long total = G(idx, 85520809984ULL, "memory.total");
    memory->total = total;
    memory->used = G(idx, 0, "memory.reserved") + G(idx, 0, "memory.used");
    memory->free = memory->used > total ? 0 : total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    DEV_ENTER("nvmlDeviceGetMemoryInfo", device);
    NEED(memory);
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total = G(idx, 85520809984ULL, "memory.total");
    memory->total = total;
    memory->reserved = G(idx, 0, "memory.reserved");
    memory->used = G(idx, 0, "memory.used");
    unsigned long long taken = memory->reserved + memory->used;
    memory->free = taken > total ? 0 : total - taken;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory) {
    DEV_ENTER("nvmlDeviceGetBAR1MemoryInfo", device);
    NEED(bar1Memory);
    bar1Memory->bar1Total = G(idx, 137438953472ULL, "bar1_total");
    bar1Memory->bar1Used = G(idx, 0, "bar1_used");
    bar1Memory->bar1Free = bar1Memory->bar1Total - bar1Memory->bar1Used;
    return NVML_SUCCESS;
}

/* "pid:bytes[,pid:bytes...]" -> entries; v1 entries only have pid/usedGpuMemory */
static nvmlReturn_t processes(const char *fn, const char *base, const char *key, nvmlDevice_t device,
                              unsigned int *infoCount, void *infos, int v1) {
    int idx = -1;
    nvmlReturn_t r = enter_dev(fn, base, device, &idx);
    if (r != NVML_SUCCESS) return r;
    NEED(infoCount);
    const char *s = GS(idx, "", "%s", key);
    unsigned int n = 0, cap = *infoCount;
    for (const char *p = s; *p;) {
        char *end;
        unsigned long pid = strtoul(p, &end, 0);
        if (end == p) { p++; continue; }
        unsigned long long mem = 0;
        if (*end == ':') mem = strtoull(end + 1, &end, 0);
        if (infos && n < cap) {
            if (v1) {
                nvmlProcessInfo_v1_t *e = (nvmlProcessInfo_v1_t *)infos + n;
                e->pid = (unsigned int)pid;
                e->usedGpuMemory = mem;
            } else {
                nvmlProcessInfo_t *e = (nvmlProcessInfo_t *)infos + n;
                e->pid = (unsigned int)pid;
                e->usedGpuMemory = mem;
                e->gpuInstanceId = 0xFFFFFFFFu;
                e->computeInstanceId = 0xFFFFFFFFu;
            }
        }
        n++;
        p = end;
        while (*p && *p != ',') p++;
    }
    *infoCount = n;
    if (n > cap || (!infos && n > 0)) return NVML_ERROR_INSUFFICIENT_SIZE;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    return processes(__func__, "nvmlDeviceGetComputeRunningProcesses", "processes", device, infoCount, infos, 0);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos) {
    return processes(__func__, "nvmlDeviceGetComputeRunningProcesses", "processes", device, infoCount, infos, 0);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos) {
    return processes(__func__, "nvmlDeviceGetComputeRunningProcesses", "processes", device, infoCount, infos, 1);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    return processes(__func__, "nvmlDeviceGetGraphicsRunningProcesses", "graphics_processes", device, infoCount,
                     infos, 0);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_v2_t *infos) {
    return processes(__func__, "nvmlDeviceGetGraphicsRunningProcesses", "graphics_processes", device, infoCount,
                     infos, 0);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                   nvmlProcessInfo_v1_t *infos) {
    return processes(__func__, "nvmlDeviceGetGraphicsRunningProcesses", "graphics_processes", device, infoCount,
                     infos, 1);
}

/* ------------------------------------------------------------------------------------------ NVLink */

static nvmlReturn_t link_ok(int idx, unsigned int link) {
    unsigned long long n = G(idx, 0, "nvlink.count");
    if (!n) return NVML_ERROR_NOT_SUPPORTED;
    return link < n ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    DEV_ENTER("nvmlDeviceGetNvLinkState", device);
    NEED(isActive);
    nvmlReturn_t r = link_ok(idx, link);
    if (r != NVML_SUCCESS) return r;
    *isActive = (nvmlEnableState_t)G(idx, 1, "nvlink.links.%u.state", link);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version) {
    DEV_ENTER("nvmlDeviceGetNvLinkVersion", device);
    NEED(version);
    nvmlReturn_t r = link_ok(idx, link);
    if (r != NVML_SUCCESS) return r;
    *version = (unsigned int)G(idx, 6, "nvlink.version");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                             nvmlNvLinkErrorCounter_t counter, unsigned long long *counterValue) {
    DEV_ENTER("nvmlDeviceGetNvLinkErrorCounter", device);
    NEED(counterValue);
    static const char *names[] = {"replay", "recovery", "crc_flit", "crc_data", "ecc_data"};
    nvmlReturn_t r = link_ok(idx, link);
    if (r != NVML_SUCCESS) return r;
    if ((unsigned int)counter >= sizeof names / sizeof names[0]) return NVML_ERROR_INVALID_ARGUMENT;
    *counterValue = G(idx, 0, "nvlink.links.%u.errors.%s", link, names[counter]);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    DEV_ENTER("nvmlDeviceGetNvLinkRemotePciInfo", device);
    NEED(pci);
    nvmlReturn_t r = link_ok(idx, link);
    if (r != NVML_SUCCESS) return r;
    unsigned int d = 0, b = 0, v = 0, f = 0;
    parse_bus_id(GS(idx, "0000:00:00.0", "nvlink.links.%u.remote_bus_id", link), &d, &b, &v, &f);
    memset(pci, 0, sizeof *pci);
    pci->domain = d;
    pci->bus = b;
    pci->device = v;
    snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, d, b, v);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, d, b, v);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                 nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType) {
    DEV_ENTER("nvmlDeviceGetNvLinkRemoteDeviceType", device);
    NEED(pNvLinkDeviceType);
    nvmlReturn_t r = link_ok(idx, link);
    if (r != NVML_SUCCESS) return r;
    *pNvLinkDeviceType = (nvmlIntNvLinkDeviceType_t)G(idx, NVML_NVLINK_DEVICE_TYPE_SWITCH, "nvlink.remote_type");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link, nvmlNvLinkCapability_t capability,
                                           unsigned int *capResult) {
    DEV_ENTER("nvmlDeviceGetNvLinkCapability", device);
    NEED(capResult);
    nvmlReturn_t r = link_ok(idx, link);
    if (r != NVML_SUCCESS) return r;
    (void)capability;
    *capResult = 1;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ topology, affinity */

static void set_bit(unsigned long *set, unsigned int size, unsigned int bit) {
    unsigned int w = bit / (8 * sizeof(unsigned long));
    if (w < size) set[w] |= 1UL << (bit % (8 * sizeof(unsigned long)));
}

/* "0-55,112-167" -> bits */
static void cpulist_bits(const char *s, unsigned long *set, unsigned int size) {
    while (s && *s) {
        char *end;
        unsigned long a = strtoul(s, &end, 10), b = a;
        if (end == s) { s++; continue; }
        if (*end == '-') b = strtoul(end + 1, &end, 10);
        for (unsigned long c = a; c <= b; c++) set_bit(set, size, (unsigned int)c);
        s = end;
        if (*s == ',') s++;
    }
}

static int gpu_has_cpu(int idx, unsigned int cpu) {
    unsigned long set[64] = {0};
    cpulist_bits(GS(idx, "", "cpulist"), set, 64);
    unsigned int bits = 8 * sizeof(unsigned long);
    return cpu / bits < 64 && (set[cpu / bits] >> (cpu % bits)) & 1UL;
}

nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet,
                                                 nvmlAffinityScope_t scope) {
    DEV_ENTER("nvmlDeviceGetCpuAffinityWithinScope", device);
    NEED(cpuSet);
    if (!cpuSetSize || scope > NVML_AFFINITY_SCOPE_SOCKET) return NVML_ERROR_INVALID_ARGUMENT;
    memset(cpuSet, 0, cpuSetSize * sizeof *cpuSet);
    cpulist_bits(GS(idx, "", scope == NVML_AFFINITY_SCOPE_SOCKET ? "socket_cpulist" : "cpulist"), cpuSet, cpuSetSize);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet) {
    DEV_ENTER("nvmlDeviceGetCpuAffinity", device);
    NEED(cpuSet);
    if (!cpuSetSize) return NVML_ERROR_INVALID_ARGUMENT;
    memset(cpuSet, 0, cpuSetSize * sizeof *cpuSet);
    cpulist_bits(GS(idx, "", "cpulist"), cpuSet, cpuSetSize);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize, unsigned long *nodeSet,
                                         nvmlAffinityScope_t scope) {
    DEV_ENTER("nvmlDeviceGetMemoryAffinity", device);
    NEED(nodeSet);
    if (!nodeSetSize || scope > NVML_AFFINITY_SCOPE_SOCKET) return NVML_ERROR_INVALID_ARGUMENT;
    memset(nodeSet, 0, nodeSetSize * sizeof *nodeSet);
    const char *numa = GS(idx, "-1", "numa_node");
    if (numa[0] != '-') set_bit(nodeSet, nodeSetSize, (unsigned int)to_ull(numa, 0));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    DEV_ENTER("nvmlDeviceGetNumaNodeId", device);
    NEED(node);
    /* NVML: "only applies to platforms where the GPUs are NUMA nodes" (coherent C2C); x86 PCIe GPUs: N/S */
    const char *v = GS(idx, NULL, "gpu_numa_node");
    if (!v) return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned int)to_ull(v, 0);
    return NVML_SUCCESS;
}

/* The level between two GPUs comes from the state file ("gpu.<a>.topology.<b>"), which the fake node
 * computes from the same PCI tree it writes to sysfs (tests/fakenode/pci.py nvml_level): switches crossed
 * below a root port, the host bridge, then the NUMA node - not the socket - as the real driver decides. */
static nvmlGpuTopologyLevel_t topo_level(int a, int b) {
    if (a == b) return NVML_TOPOLOGY_INTERNAL;
    return (nvmlGpuTopologyLevel_t)G(a, NVML_TOPOLOGY_SYSTEM, "topology.%d", b);
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 nvmlGpuTopologyLevel_t *pathInfo) {
    DEV_ENTER("nvmlDeviceGetTopologyCommonAncestor", device1);
    int other = dev_index(device2);
    if (other < 0 || !pathInfo) return NVML_ERROR_INVALID_ARGUMENT;
    *pathInfo = topo_level(idx, other);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device, nvmlGpuTopologyLevel_t level, unsigned int *count,
                                              nvmlDevice_t *deviceArray) {
    DEV_ENTER("nvmlDeviceGetTopologyNearestGpus", device);
    NEED(count);
    unsigned int n = 0, cap = *count;
    for (unsigned int i = 0; i < gpu_count(); i++) {
        if ((int)i == idx || topo_level(idx, (int)i) > level) continue;
        if (deviceArray && n < cap) deviceArray[n] = &g_devs[i];
        n++;
    }
    *count = n;
    /* NVML: a NULL array (or count 0) is a size query and succeeds */
    return !deviceArray || n <= cap ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

nvmlReturn_t nvmlSystemGetTopologyGpuSet(unsigned int cpuNumber, unsigned int *count, nvmlDevice_t *deviceArray) {
    SYS_ENTER("nvmlSystemGetTopologyGpuSet");
    NEED(count);
    unsigned int n = 0, cap = *count;
    for (unsigned int i = 0; i < gpu_count(); i++) {
        if (!gpu_has_cpu((int)i, cpuNumber)) continue;
        if (deviceArray && n < cap) deviceArray[n] = &g_devs[i];
        n++;
    }
    *count = n;
    /* NVML: a NULL array (or count 0) is a size query and succeeds */
    return !deviceArray || n <= cap ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

/* ------------------------------------------------------------------------------------------ fields, fabric */

/*
 * Time (ns) the clocks were held down, per reason: the perf-policy counters (74-79) are the ones
 * nvmlDeviceGetViolationStatus reads, and nvml.h maps the clocks-event fields onto them (POWER ->
 * SW_POWER_CAP, THERMAL -> SW_THERM_SLOWDOWN, SYNC_BOOST -> SYNC_BOOST). The HW thermal and HW power
 * brake fields (R535+) have no violation policy: clock_event_ns.*; clock_event_ns.supported = 0 makes
 * 269-271 NOT_SUPPORTED, as a pre-R535 driver answers. Returns 1 when it answered the field.
 */
static int clock_event_field(int idx, nvmlFieldValue_t *f) {
    static const char *policies[] = {"power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability"};
    const char *key = NULL;
    if (f->fieldId >= NVML_FI_DEV_PERF_POLICY_POWER && f->fieldId <= NVML_FI_DEV_PERF_POLICY_RELIABILITY) {
        f->value.ullVal = G(idx, 0, "violation_ns.%s", policies[f->fieldId - NVML_FI_DEV_PERF_POLICY_POWER]);
        return 1;
    }
#ifdef NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
    if (f->fieldId == NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN) key = "violation_ns.thermal";
    if (f->fieldId == NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN) key = "clock_event_ns.hw_therm_slowdown";
    if (f->fieldId == NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN)
        key = "clock_event_ns.hw_power_brake_slowdown";
#endif
    if (!key) return 0;
    if (!G(idx, 1, "clock_event_ns.supported")) {
        f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        f->value.ullVal = 0;
        return 1;
    }
    f->value.ullVal = G(idx, 0, "%s", key);
    return 1;
}

/*
 * NVLink error counters of one link as field values (NVML_FI_DEV_NVLINK_<counter>_ERROR_COUNT_L<n>): the
 * numbers nvmlDeviceGetNvLinkErrorCounter answers for that link and counter. nvml.h numbers links 0-5
 * and 6-11 of the first four counters in two runs each, and the ECC data counter's links 0-11 in one;
 * it has no per-link ids past link 11. The entry's nvmlReturn is what the per-link call would return
 * (NOT_SUPPORTED without NVLinks); nvlink.error_fields.supported = 0 makes every one of them
 * NOT_SUPPORTED, as a driver that serves the counters only through the per-link call.
 * Returns 1 when the field is one of them.
 */
_Static_assert(NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L5 == NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0 + 5, "run");
_Static_assert(NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L11 == NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6 + 5, "run");
_Static_assert(NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L11 == NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L0 + 11, "run");
static int nvlink_error_field(int idx, nvmlFieldValue_t *f) {
    static const struct {
        unsigned int first_id, first_link, links;
        const char *counter;
    } runs[] = {
        {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, 0, 6, "replay"},
        {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6, 6, 6, "replay"},
        {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, 0, 6, "recovery"},
        {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6, 6, 6, "recovery"},
        {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, 0, 6, "crc_flit"},
        {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6, 6, 6, "crc_flit"},
        {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, 0, 6, "crc_data"},
        {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6, 6, 6, "crc_data"},
        {NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L0, 0, 12, "ecc_data"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        if (f->fieldId < runs[i].first_id || f->fieldId >= runs[i].first_id + runs[i].links) continue;
        unsigned int link = runs[i].first_link + (f->fieldId - runs[i].first_id);
        nvmlReturn_t r = G(idx, 1, "nvlink.error_fields.supported") ? link_ok(idx, link) : NVML_ERROR_NOT_SUPPORTED;
        f->nvmlReturn = r;
        f->value.ullVal = r == NVML_SUCCESS ? G(idx, 0, "nvlink.links.%u.errors.%s", link, runs[i].counter) : 0;
        /* a refused entry keeps valueType 0 (double), as the 580 driver leaves it (h200-vm's answers) */
        if (r != NVML_SUCCESS) f->valueType = NVML_VALUE_TYPE_DOUBLE;
        return 1;
    }
    return 0;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    DEV_ENTER("nvmlDeviceGetFieldValues", device);
    NEED(values);
    if (valuesCount < 0) return NVML_ERROR_INVALID_ARGUMENT;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *f = &values[i];
        f->timestamp = (long long)tv.tv_sec * 1000000LL + tv.tv_usec;
        f->latencyUsec = 0;
        const char *v = GS(idx, NULL, "fields.%u", f->fieldId);
        f->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        f->nvmlReturn = NVML_SUCCESS;
#ifdef NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        if (!v && f->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
            f->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            f->value.uiVal = (unsigned int)G(idx, 0, "recovery_action");
            continue;
        }
#endif
#ifdef NVML_FI_DEV_NVLINK_LINK_COUNT
        if (!v && f->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT) {
            /* a GPU without NVLink (a PCIe H200 on 580.159.04, tests/captures/device/h200-vm) answers
             * NOT_SUPPORTED for the count, not 0; the value type is set either way */
            f->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            unsigned int count = (unsigned int)G(idx, 0, "nvlink.count");
            f->nvmlReturn = count ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
            f->value.uiVal = count;
            continue;
        }
#endif
#ifdef NVML_FI_DEV_PCIE_REPLAY_COUNTER
        if (!v && f->fieldId == NVML_FI_DEV_PCIE_REPLAY_COUNTER) {
            f->value.ullVal = G(idx, 0, "pcie.replay_counter");
            continue;
        }
#endif
        if (!v && clock_event_field(idx, f)) continue;
        if (!v && nvlink_error_field(idx, f)) continue;
        if (!v) {
            f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            f->value.ullVal = 0;
            continue;
        }
        f->value.ullVal = to_ull(v, 0);
    }
    return NVML_SUCCESS;
}

static void fabric_uuid(int idx, unsigned char *out) {
    const char *s = GS(idx, "", "fabric.cluster_uuid");
    memset(out, 0, NVML_GPU_FABRIC_UUID_LEN);
    for (int n = 0; *s && n < NVML_GPU_FABRIC_UUID_LEN;) {
        unsigned int byte;
        if (isxdigit((unsigned char)s[0]) && isxdigit((unsigned char)s[1]) && sscanf(s, "%2x", &byte) == 1) {
            out[n++] = (unsigned char)byte;
            s += 2;
        } else {
            s++;
        }
    }
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo) {
    DEV_ENTER("nvmlDeviceGetGpuFabricInfo", device);
    NEED(gpuFabricInfo);
    if (!G(idx, 1, "fabric.supported")) return NVML_ERROR_NOT_SUPPORTED;
    fabric_uuid(idx, gpuFabricInfo->clusterUuid);
    gpuFabricInfo->status = (nvmlReturn_t)G(idx, 0, "fabric.status");
    gpuFabricInfo->cliqueId = (unsigned int)G(idx, 0, "fabric.clique_id");
    gpuFabricInfo->state = (nvmlGpuFabricState_t)G(idx, NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, "fabric.state");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo) {
    DEV_ENTER("nvmlDeviceGetGpuFabricInfo", device);
    NEED(gpuFabricInfo);
    if (!G(idx, 1, "fabric.supported")) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int version = gpuFabricInfo->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    fabric_uuid(idx, gpuFabricInfo->clusterUuid);
    gpuFabricInfo->status = (nvmlReturn_t)G(idx, 0, "fabric.status");
    gpuFabricInfo->cliqueId = (unsigned int)G(idx, 0, "fabric.clique_id");
    gpuFabricInfo->state = (nvmlGpuFabricState_t)G(idx, NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, "fabric.state");
    gpuFabricInfo->healthMask = (unsigned int)G(idx, 0, "fabric.health_mask");
    if (version == nvmlGpuFabricInfo_v3) gpuFabricInfo->healthSummary = (unsigned char)G(idx, 0, "fabric.health_summary");
    return NVML_SUCCESS;
}
