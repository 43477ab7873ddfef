/* One launcher for every Triton 3.6 NVIDIA kernel whose parameters are scalars and pointers.
 *
 * Triton builds a C launcher per signature and calls it with ~13 header values plus every argument, parsed by
 * PyArg_ParseTuple from a format string; with its context check, hook checks and GIL release that is ~4.5 us of
 * host time a launch on an H100 host. Here the constant part of a launch (function, grid, block, shared memory,
 * launch attributes, argument kinds) is fixed once in a Prepared object, and launch(prepared, stream, *args)
 * converts each argument by its kind and calls cuLaunchKernelEx: the per-call cost is the driver call plus one
 * C-API conversion an argument (on an H100 host, 0.19 us outside the driver call for a 5-argument kernel, whose
 * launch costs ~3-4 us in all against Triton's launcher's ~3.5-5.2 us in the same process).
 *
 * Prepared is a small type rather than a PyCapsule or an index into a C table: checking it is one pointer
 * compare (a capsule's check compares its name string every call), its kinds live in the same allocation as
 * the config, and its lifetime is the Python object's (a table would need its own freeing rules).
 *
 * The parameter ABI (what the kernel reads) follows Triton 3.6's NVIDIA launcher: pointers are 8-byte device
 * addresses, integers their C width, fp16/bf16/fp32/fp64 their storage bits, and two trailing 8-byte pointers
 * (global scratch, profile scratch) which are 0 here because prepare() refuses kernels that use either.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "cuda.h"

_Static_assert(sizeof(long) == 8, "conversions use C long as a 64-bit integer (LP64)");

/* The most runtime arguments a prepared launch takes. The params array lives on the stack; CUDA's classic
 * 4 KB parameter limit is 512 eight-byte values, and the largest Triton kernel signature we launch has < 40. */
#define MAX_ARGS 512

enum {
    K_PTR, K_I1, K_I8, K_I16, K_I32, K_I64, K_U1, K_U8, K_U16, K_U32, K_U64,
    K_FP16, K_BF16, K_FP32, K_FP64, N_KINDS
};

/* name: the Triton signature type; size: the bytes the kernel reads; lo/hi: an integer kind's range */
static const struct {
    const char *name;
    unsigned char size;
    long lo, hi;
} KINDS[N_KINDS] = {
    [K_PTR] = {"ptr", 8, 0, 0},
    [K_I1] = {"i1", 1, 0, 1},
    [K_I8] = {"i8", 1, INT8_MIN, INT8_MAX},
    [K_I16] = {"i16", 2, INT16_MIN, INT16_MAX},
    [K_I32] = {"i32", 4, INT32_MIN, INT32_MAX},
    [K_I64] = {"i64", 8, INT64_MIN, INT64_MAX},
    [K_U1] = {"u1", 1, 0, 1},
    [K_U8] = {"u8", 1, 0, UINT8_MAX},
    [K_U16] = {"u16", 2, 0, UINT16_MAX},
    [K_U32] = {"u32", 4, 0, UINT32_MAX},
    [K_U64] = {"u64", 8, 0, 0},
    [K_FP16] = {"fp16", 2, 0, 0},
    [K_BF16] = {"bf16", 2, 0, 0},
    [K_FP32] = {"fp32", 4, 0, 0},
    [K_FP64] = {"fp64", 8, 0, 0},
};

/* A kind from a Triton signature type string, -1 if this launcher does not take it. */
static int kind_of(const char *ty)
{
    if (ty[0] == '*')
        return K_PTR; /* "*fp32", "*kfp32" (const): every pointer is a device address */
    if (strcmp(ty, "f32") == 0)
        return K_FP32; /* Triton's launcher treats "f32" as "fp32" */
    for (int k = 0; k < N_KINDS; k++) /* (a Prepared's own kind names, "ptr" included, are taken back) */
        if (strcmp(ty, KINDS[k].name) == 0)
            return k;
    return -1;
}

/* ------------------------------------------------------------------------------------------------- driver */
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*func_set_attr_fn)(CUfunction, CUfunction_attribute, int);
typedef CUresult (*error_text_fn)(CUresult, const char **);

static launch_ex_fn drv_launch;
static func_set_attr_fn drv_set_attr;
static error_text_fn drv_error_name, drv_error_string;

/* Resolved on the first real launch, not at import, so the module imports (and dry-runs) without a GPU. The
 * symbols come from dlopen rather than linking -lcuda so that building needs no driver library. Called with
 * the GIL held, so two threads cannot race on the pointers. */
static int load_driver(void)
{
    if (drv_launch)
        return 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        PyErr_Format(PyExc_RuntimeError, "fast_launch: cannot load the CUDA driver libcuda.so.1 (%s)",
                     why ? why : "unknown error");
        return -1;
    }
    launch_ex_fn launch = (launch_ex_fn)dlsym(lib, "cuLaunchKernelEx");
    if (!launch) {
        PyErr_SetString(PyExc_RuntimeError,
                        "fast_launch: libcuda.so.1 has no cuLaunchKernelEx (a driver older than CUDA 12.0)");
        return -1;
    }
    drv_set_attr = (func_set_attr_fn)dlsym(lib, "cuFuncSetAttribute");
    drv_error_name = (error_text_fn)dlsym(lib, "cuGetErrorName");
    drv_error_string = (error_text_fn)dlsym(lib, "cuGetErrorString");
    drv_launch = launch;
    return 0;
}

static PyObject *driver_error(const char *call, PyObject *kernel, CUresult rc)
{
    const char *name = NULL, *text = NULL;
    if (drv_error_name)
        drv_error_name(rc, &name);
    if (drv_error_string)
        drv_error_string(rc, &text);
    PyErr_Format(PyExc_RuntimeError, "fast_launch: %s of kernel %R failed: %s (%d): %s", call, kernel,
                 name ? name : "CUDA error", (int)rc, text ? text : "no description");
    return NULL;
}

/* ------------------------------------------------------------------------------------------- Prepared */
typedef struct {
    PyObject_VAR_HEAD
    PyObject *name;       /* the kernel's name, for error messages */
    CUfunction function;
    unsigned grid[3];     /* in clusters along x, as the caller gave it */
    unsigned num_warps, num_ctas, shared;
    int cooperative, pdl, device;
    int empty;            /* a grid with no blocks: Triton skips the driver call, so do we */
    int cluster_attr_set; /* num_ctas == 16 needs a per-function opt-in, made once */
    CUlaunchConfig config; /* everything but hStream and attrs, which are set a call */
    CUlaunchAttribute attrs[4];
    unsigned char kinds[]; /* ob_size of them */
} Prepared;

static PyTypeObject PreparedType;

static void prepared_dealloc(Prepared *self)
{
    Py_XDECREF(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *prepared_kinds(Prepared *self, void *closure)
{
    (void)closure;
    PyObject *out = PyTuple_New(Py_SIZE(self));
    if (!out)
        return NULL;
    for (Py_ssize_t i = 0; i < Py_SIZE(self); i++) {
        PyObject *s = PyUnicode_FromString(KINDS[self->kinds[i]].name);
        if (!s) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, s);
    }
    return out;
}

static PyObject *prepared_grid(Prepared *self, void *closure)
{
    (void)closure;
    return Py_BuildValue("(III)", self->grid[0], self->grid[1], self->grid[2]);
}

static PyObject *prepared_function(Prepared *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)self->function);
}

static PyObject *prepared_repr(Prepared *self)
{
    return PyUnicode_FromFormat("<Prepared %S grid=(%u, %u, %u) warps=%u ctas=%u shared=%u args=%zd>",
                                self->name, self->grid[0], self->grid[1], self->grid[2], self->num_warps,
                                self->num_ctas, self->shared, Py_SIZE(self));
}

static PyMemberDef prepared_members[] = {
    {"name", T_OBJECT, offsetof(Prepared, name), READONLY, "the kernel's name"},
    {"num_warps", T_UINT, offsetof(Prepared, num_warps), READONLY, NULL},
    {"num_ctas", T_UINT, offsetof(Prepared, num_ctas), READONLY, NULL},
    {"shared", T_UINT, offsetof(Prepared, shared), READONLY, "dynamic shared memory bytes"},
    {"cooperative", T_INT, offsetof(Prepared, cooperative), READONLY, NULL},
    {"pdl", T_INT, offsetof(Prepared, pdl), READONLY, NULL},
    {"device", T_INT, offsetof(Prepared, device), READONLY, "the CUDA device index the caller bound it for"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef prepared_getset[] = {
    {"kinds", (getter)prepared_kinds, NULL, "the runtime arguments' kinds, in order", NULL},
    {"grid", (getter)prepared_grid, NULL, NULL, NULL},
    {"function", (getter)prepared_function, NULL, "the CUfunction handle", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PreparedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tilefuse_fast_launch.Prepared",
    .tp_doc = "A kernel's launch with everything but the stream and the runtime arguments fixed (see make()).",
    .tp_basicsize = offsetof(Prepared, kinds),
    .tp_itemsize = 1,
    .tp_dealloc = (destructor)prepared_dealloc,
    .tp_repr = (reprfunc)prepared_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_members = prepared_members,
    .tp_getset = prepared_getset,
};

static int as_uint32(PyObject *o, const char *what, unsigned *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (PyErr_Occurred() || v > UINT32_MAX) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "fast_launch.make: %s must be an int in [0, 2**32), got %R", what, o);
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

static PyObject *make(PyObject *module, PyObject *args, PyObject *kw)
{
    (void)module;
    static char *names[] = {"function", "grid", "num_warps", "num_ctas", "shared", "cooperative", "pdl",
                            "kinds", "name", "device", NULL};
    PyObject *function, *grid, *kinds, *name = NULL;
    int num_warps, num_ctas, shared, cooperative, pdl, device = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOiiippO|Ui", names, &function, &grid, &num_warps, &num_ctas,
                                     &shared, &cooperative, &pdl, &kinds, &name, &device))
        return NULL;
    unsigned long long handle = PyLong_AsUnsignedLongLong(function);
    if (PyErr_Occurred() || handle == 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "fast_launch.make: function must be a loaded CUfunction handle, got %R",
                     function);
        return NULL;
    }
    PyObject *g = PySequence_Tuple(grid);
    if (!g)
        return NULL;
    unsigned dims[3] = {1, 1, 1};
    Py_ssize_t ng = PyTuple_GET_SIZE(g);
    int bad = ng < 1 || ng > 3;
    for (Py_ssize_t i = 0; i < ng && !bad; i++)
        bad = as_uint32(PyTuple_GET_ITEM(g, i), "each grid size", &dims[i]) < 0;
    Py_DECREF(g);
    if (bad) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "fast_launch.make: grid must have 1 to 3 sizes, got %R", grid);
        return NULL;
    }
    /* Triton's grid is a C int; 1024 threads is the most a block holds; 16 the most CTAs a cluster does */
    if (num_warps < 1 || num_warps > 32 || num_ctas < 1 || num_ctas > 16 || shared < 0 ||
        (unsigned long long)dims[0] * (unsigned)num_ctas > INT32_MAX || dims[1] > INT32_MAX || dims[2] > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "fast_launch.make: grid %R x %d CTAs, %d warps, %d shared bytes is not a "
                     "launch", grid, num_ctas, num_warps, shared);
        return NULL;
    }
    PyObject *ks = PySequence_Tuple(kinds);
    if (!ks)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(ks);
    if (n > MAX_ARGS) {
        Py_DECREF(ks);
        PyErr_Format(PyExc_ValueError, "fast_launch.make: %zd arguments, at most %d", n, MAX_ARGS);
        return NULL;
    }
    Prepared *p = PyObject_NewVar(Prepared, &PreparedType, n);
    if (!p) {
        Py_DECREF(ks);
        return NULL;
    }
    p->name = NULL; /* (dealloc reads it if a kind below is refused) */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(ks, i);
        const char *ty = PyUnicode_Check(k) ? PyUnicode_AsUTF8(k) : NULL;
        int kind = ty ? kind_of(ty) : -1;
        if (kind < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "fast_launch.make: argument %zd has kind %R, which this launcher "
                             "does not pass", i, k);
            Py_DECREF(ks);
            Py_DECREF(p);
            return NULL;
        }
        p->kinds[i] = (unsigned char)kind;
    }
    Py_DECREF(ks);
    p->name = name ? name : PyUnicode_FromString("?");
    Py_XINCREF(name);
    if (!p->name) {
        Py_DECREF(p);
        return NULL;
    }
    p->function = (CUfunction)(uintptr_t)handle;
    memcpy(p->grid, dims, sizeof dims);
    p->num_warps = num_warps;
    p->num_ctas = num_ctas;
    p->shared = shared;
    p->cooperative = cooperative;
    p->pdl = pdl;
    p->device = device;
    p->empty = dims[0] == 0 || dims[1] == 0 || dims[2] == 0;
    p->cluster_attr_set = 0;

    /* The config Triton 3.6 builds each launch, built once: the x grid counts CTAs (clusters x num_ctas), a
     * block is num_warps warps, and the attributes go in Triton's order (PDL, cooperative, cluster). */
    memset(&p->config, 0, sizeof p->config);
    memset(p->attrs, 0, sizeof p->attrs);
    p->config.gridDimX = dims[0] * (unsigned)num_ctas;
    p->config.gridDimY = dims[1];
    p->config.gridDimZ = dims[2];
    p->config.blockDimX = 32 * (unsigned)num_warps;
    p->config.blockDimY = 1;
    p->config.blockDimZ = 1;
    p->config.sharedMemBytes = (unsigned)shared;
    unsigned na = 0;
    if (pdl) {
        p->attrs[na].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        p->attrs[na++].value.programmaticStreamSerializationAllowed = 1;
    }
    if (cooperative) {
        p->attrs[na].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        p->attrs[na++].value.cooperative = 1;
    }
    if (num_ctas != 1) {
        p->attrs[na].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        p->attrs[na].value.clusterDim.x = (unsigned)num_ctas;
        p->attrs[na].value.clusterDim.y = 1;
        p->attrs[na++].value.clusterDim.z = 1;
        p->attrs[na].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
        p->attrs[na++].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
    }
    p->config.numAttrs = na;
    return (PyObject *)p;
}

/* ---------------------------------------------------------------------------------------------- launch */
typedef union {
    int8_t i8;
    int16_t i16;
    int32_t i32;
    int64_t i64;
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
} Slot;

static int dry_run; /* set_dry_run(True): launch returns what it would pass instead of calling the driver */

static int bad_type(Prepared *p, Py_ssize_t i, const char *expected, PyObject *o)
{
    PyErr_Format(PyExc_TypeError, "fast_launch: kernel %R argument %zd (%s) must be %s, got %.100s", p->name, i,
                 KINDS[p->kinds[i]].name, expected, Py_TYPE(o)->tp_name);
    return -1;
}

static int out_of_range(Prepared *p, Py_ssize_t i, PyObject *o)
{
    PyErr_Format(PyExc_OverflowError, "fast_launch: kernel %R argument %zd (%s): %R is out of range", p->name, i,
                 KINDS[p->kinds[i]].name, o);
    return -1;
}

/* An integer argument as an int object (a new reference). A pointer takes only an int (not a bool, and not an
 * object with __index__: a one-element integer tensor passed by mistake for its data_ptr() would otherwise be
 * taken as an address); other integer kinds take any object with __index__ (numpy integers), as
 * PyArg_ParseTuple's integer formats do, but never a float (it would be truncated). */
static PyObject *as_int(Prepared *p, Py_ssize_t i, PyObject *o)
{
    if (p->kinds[i] == K_PTR) {
        if (PyLong_Check(o) && !PyBool_Check(o)) {
            Py_INCREF(o);
            return o;
        }
        bad_type(p, i, "an int (a device address)", o);
        return NULL;
    }
    if (PyLong_Check(o)) {
        Py_INCREF(o);
        return o;
    }
    PyObject *v = PyFloat_Check(o) ? NULL : PyNumber_Index(o);
    if (!v) {
        PyErr_Clear();
        bad_type(p, i, p->kinds[i] == K_PTR ? "an int (a device address)" : "an int", o);
    }
    return v;
}

static int pack_float(Prepared *p, Py_ssize_t i, PyObject *o, Slot *s)
{
    double d;
    if (PyFloat_CheckExact(o)) {
        d = PyFloat_AS_DOUBLE(o);
    } else {
        d = PyFloat_AsDouble(o); /* ints and objects with __float__, as Triton's "d" format takes them */
        if (d == -1.0 && PyErr_Occurred()) {
            int overflow = PyErr_ExceptionMatches(PyExc_OverflowError);
            PyErr_Clear();
            return overflow ? out_of_range(p, i, o) : bad_type(p, i, "a float", o);
        }
    }
    switch (p->kinds[i]) {
    case K_FP16: { /* round to nearest even; a value beyond fp16's range is an error, not inf */
        unsigned char b[2];
#if PY_VERSION_HEX >= 0x030B0000
        int rc = PyFloat_Pack2(d, (char *)b, 1);
#else
        int rc = _PyFloat_Pack2(d, b, 1);
#endif
        if (rc < 0) {
            PyErr_Clear();
            return out_of_range(p, i, o);
        }
        s->u16 = (uint16_t)(b[0] | (b[1] << 8));
        return 0;
    }
    case K_BF16: { /* the top half of the fp32 bits (truncation), the bits Triton's launcher passes */
        float f = (float)d;
        uint32_t u;
        memcpy(&u, &f, 4);
        s->u16 = (uint16_t)(u >> 16);
        return 0;
    }
    case K_FP32: { /* C's double-to-float conversion, as Triton's launcher: beyond fp32's range gives inf */
        float f = (float)d;
        memcpy(&s->u32, &f, 4);
        return 0;
    }
    default:
        memcpy(&s->u64, &d, 8);
        return 0;
    }
}

static int pack(Prepared *p, Py_ssize_t i, PyObject *o, Slot *s)
{
    int k = p->kinds[i];
    if (k >= K_FP16)
        return pack_float(p, i, o, s);
    if (k == K_PTR || k == K_U64) {
        /* the common case (an exact int) skips as_int's reference juggling */
        if (PyLong_CheckExact(o)) {
            unsigned long v = PyLong_AsUnsignedLong(o);
            if (v == (unsigned long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                return out_of_range(p, i, o);
            }
            s->u64 = v;
            return 0;
        }
        PyObject *v = as_int(p, i, o);
        if (!v)
            return -1;
        unsigned long u = PyLong_AsUnsignedLong(v);
        Py_DECREF(v);
        if (u == (unsigned long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return out_of_range(p, i, o);
        }
        s->u64 = u;
        return 0;
    }
    long v;
    int overflow;
    if (PyLong_CheckExact(o)) {
        v = PyLong_AsLongAndOverflow(o, &overflow);
    } else {
        PyObject *n = as_int(p, i, o);
        if (!n)
            return -1;
        v = PyLong_AsLongAndOverflow(n, &overflow);
        Py_DECREF(n);
    }
    if (overflow || v < KINDS[k].lo || v > KINDS[k].hi)
        return out_of_range(p, i, o);
    switch (KINDS[k].size) {
    case 1:
        if (k == K_I8)
            s->i8 = (int8_t)v;
        else
            s->u8 = (uint8_t)v;
        break;
    case 2:
        if (k == K_I16)
            s->i16 = (int16_t)v;
        else
            s->u16 = (uint16_t)v;
        break;
    case 4:
        if (k == K_I32)
            s->i32 = (int32_t)v;
        else
            s->u32 = (uint32_t)v;
        break;
    default:
        s->i64 = v;
    }
    return 0;
}

/* What launch would pass: (params, config) with params the bytes the driver would read for each parameter, the
 * two scratch pointers last, and config the CUlaunchConfig as a dict. Read back from the very arrays the real
 * launch hands to the driver, so a test of it tests the packing. */
static PyObject *describe(Prepared *p, void **params, Py_ssize_t n, const CUlaunchConfig *c)
{
    PyObject *bytes = PyTuple_New(n + 2);
    if (!bytes)
        return NULL;
    for (Py_ssize_t i = 0; i < n + 2; i++) {
        PyObject *b = PyBytes_FromStringAndSize(params[i], i < n ? KINDS[p->kinds[i]].size : 8);
        if (!b) {
            Py_DECREF(bytes);
            return NULL;
        }
        PyTuple_SET_ITEM(bytes, i, b);
    }
    PyObject *attrs = PyList_New(0);
    for (unsigned a = 0; attrs && a < c->numAttrs; a++) {
        const CUlaunchAttribute *at = &c->attrs[a];
        PyObject *item = NULL;
        switch (at->id) {
        case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
            item = Py_BuildValue("(si)", "pdl", at->value.programmaticStreamSerializationAllowed);
            break;
        case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
            item = Py_BuildValue("(si)", "cooperative", at->value.cooperative);
            break;
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
            item = Py_BuildValue("(s(III))", "cluster_dim", at->value.clusterDim.x, at->value.clusterDim.y,
                                 at->value.clusterDim.z);
            break;
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
            item = Py_BuildValue("(ss)", "cluster_scheduling",
                                 at->value.clusterSchedulingPolicyPreference == CU_CLUSTER_SCHEDULING_POLICY_SPREAD
                                     ? "spread" : "other");
            break;
        default:
            item = Py_BuildValue("(si)", "unknown", (int)at->id);
        }
        if (!item || PyList_Append(attrs, item) < 0)
            Py_CLEAR(attrs);
        Py_XDECREF(item);
    }
    if (!attrs) {
        Py_DECREF(bytes);
        return NULL;
    }
    PyObject *config = Py_BuildValue(
        "{s(III)s(III)sIsKsNsKsO}", "grid", c->gridDimX, c->gridDimY, c->gridDimZ, "block", c->blockDimX,
        c->blockDimY, c->blockDimZ, "shared", c->sharedMemBytes, "stream",
        (unsigned long long)(uintptr_t)c->hStream, "attrs", PyList_AsTuple(attrs), "function",
        (unsigned long long)(uintptr_t)p->function, "launch", p->empty ? Py_False : Py_True);
    Py_DECREF(attrs);
    if (!config) {
        Py_DECREF(bytes);
        return NULL;
    }
    return Py_BuildValue("(NN)", bytes, config);
}

static PyObject *launch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 2 || Py_TYPE(args[0]) != &PreparedType) {
        PyErr_SetString(PyExc_TypeError, "fast_launch.launch(prepared, stream, *args): the first argument must "
                                         "be a Prepared (from make())");
        return NULL;
    }
    Prepared *p = (Prepared *)args[0];
    Py_ssize_t n = Py_SIZE(p);
    if (nargs - 2 != n) {
        PyErr_Format(PyExc_TypeError, "fast_launch: kernel %R takes %zd runtime arguments, got %zd", p->name, n,
                     nargs - 2);
        return NULL;
    }
    unsigned long stream = PyLong_CheckExact(args[1]) ? PyLong_AsUnsignedLong(args[1]) : (unsigned long)-1;
    if (stream == (unsigned long)-1) { /* (not a real stream handle either) */
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "fast_launch: the stream must be an int (a raw CUstream), got %R", args[1]);
        return NULL;
    }
    Slot slots[MAX_ARGS + 2];
    void *params[MAX_ARGS + 2];
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pack(p, i, args[i + 2], &slots[i]) < 0)
            return NULL;
        params[i] = &slots[i];
    }
    /* global scratch and profile scratch: none, as Triton passes a NULL CUdeviceptr when it allocates none */
    slots[n].u64 = slots[n + 1].u64 = 0;
    params[n] = &slots[n];
    params[n + 1] = &slots[n + 1];

    CUlaunchConfig config = p->config;
    config.hStream = (CUstream)(uintptr_t)stream;
    config.attrs = p->attrs;
    if (dry_run)
        return describe(p, params, n, &config);
    if (p->empty)
        Py_RETURN_NONE;
    if (load_driver() < 0)
        return NULL;
    if (p->num_ctas == 16 && !p->cluster_attr_set) {
        /* 16-CTA clusters are non-portable and need this opt-in (H100 and B200 take them); it is a property of
         * the function, so once is enough */
        CUresult rc = drv_set_attr ? drv_set_attr(p->function, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
                                   : CUDA_ERROR_NOT_SUPPORTED;
        if (rc != CUDA_SUCCESS)
            return driver_error("cuFuncSetAttribute", p->name, rc);
        p->cluster_attr_set = 1;
    }
    /* No cuCtxGetCurrent here (Triton's launcher calls it every launch, to make a context current in a process
     * that never touched CUDA): a Prepared is only made from a kernel that Triton's JIT has already launched in
     * this process, which left its device's primary context current.
     *
     * The GIL stays held across the driver call, unlike Triton's launcher. The call returns in ~3 us unless the
     * launch queue is full; releasing and retaking the GIL costs ~0.1-0.2 us uncontended, but with another Python
     * thread runnable the retake waits for it to yield, up to sys.getswitchinterval() = 5 ms, i.e. 1000x the
     * launch. PyTorch's own eager launches hold the GIL too, so a thread blocked on a full queue here stalls other
     * threads exactly as an eager op would. Holding it also makes load_driver()'s lazy setup race-free.
     *
     * cuLaunchKernelEx even without attributes: the classic cuLaunchKernel measured the same on the H100 host
     * (3.00 against 2.93 us a launch, best of five rounds of 3000). */
    CUresult rc = drv_launch(&config, p->function, params, NULL);
    if (rc != CUDA_SUCCESS)
        return driver_error("cuLaunchKernelEx", p->name, rc);
    Py_RETURN_NONE;
}

static PyObject *set_dry_run(PyObject *module, PyObject *on)
{
    (void)module;
    int v = PyObject_IsTrue(on);
    if (v < 0)
        return NULL;
    PyObject *was = dry_run ? Py_True : Py_False;
    dry_run = v;
    Py_INCREF(was);
    return was;
}

static PyMethodDef methods[] = {
    {"make", (PyCFunction)(void (*)(void))make, METH_VARARGS | METH_KEYWORDS,
     "make(function, grid, num_warps, num_ctas, shared, cooperative, pdl, kinds, name='?', device=-1) -> "
     "Prepared\n\nkinds: one Triton signature type a runtime argument ('*fp32', 'i32', 'fp32', ...)."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(prepared, stream, *runtime_args): convert each argument by its kind and call cuLaunchKernelEx. "
     "Returns None; in dry-run mode returns (params, config) instead of launching."},
    {"set_dry_run", set_dry_run, METH_O,
     "set_dry_run(on) -> the previous setting. For tests: launch returns (params, config) and calls no driver."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tilefuse_fast_launch",
    "One launcher for Triton 3.6 NVIDIA kernels of scalar and pointer arguments (tilefuse.kernels.fast_launch).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_tilefuse_fast_launch(void)
{
    if (PyType_Ready(&PreparedType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    PyObject *names = PyTuple_New(N_KINDS);
    if (!names) {
        Py_DECREF(m);
        return NULL;
    }
    for (int k = 0; k < N_KINDS; k++)
        PyTuple_SET_ITEM(names, k, PyUnicode_FromString(KINDS[k].name));
    Py_INCREF(&PreparedType);
    if (PyModule_AddObject(m, "KINDS", names) < 0 ||
        PyModule_AddObject(m, "Prepared", (PyObject *)&PreparedType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_ARGS", MAX_ARGS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
