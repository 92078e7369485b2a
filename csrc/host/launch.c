/* Chord's eager launch path in C: a repeated call with arguments a launch plan was made for.
 *
 * chord.ops validates a call's arguments in Python (dtype, device, shape, strides, alignment,
 * schedule) and computes everything a launch needs that follows from that metadata: kernel,
 * grid, block, shared memory, the parameter block with its scalars and workspaces. chord.launch
 * packs that as a plan (the Plan struct below) under the call's signature. A later call with the
 * same signature needs only its data pointers: this module reads the signature of the call's
 * arguments, finds the plan, checks what depends on the pointers (out must overlap no other tensor), puts
 * the pointers into the parameter block and calls cuLaunchKernel(Ex). Anything it cannot decide
 * (an argument that is not a plain tensor or an exact int, a signature without a plan, overlap,
 * a plan bound to another stream) is a miss: the caller runs the Python path, which validates,
 * raises or launches, and makes the plan.
 *
 * The signature covers every piece of metadata the Python validation reads, so a call whose
 * arguments differ in any checked property never meets a plan made for others:
 *   exact int:       tag 1, value
 *   tensor:          tag 2, dtype (the dtype object's address: torch dtypes are singletons),
 *                    get_device(), is_cuda, ndim, shape, strides, data_ptr() & 15
 *
 * Only the CPython API is used (no torch headers: the module builds with the system C compiler
 * against any torch); the driver entry points and torch's raw-stream accessor are handed over by
 * configure(). Built and loaded by chord/launch.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_ITEMS 12
#define MAX_DIMS 8
#define PARAM_BYTES 256
#define SIG_WORDS (MAX_ITEMS * (6 + 2 * MAX_DIMS))

enum { PLAN_PDL = 1, PLAN_STREAM_BOUND = 2, PLAN_NOOP = 4 };

/* The launch plan, packed by chord.launch (struct "<QQ2Q3I3IIIi2i12iI256s", PLAN_BYTES). */
typedef struct {
    uint64_t func;          /* CUfunction on the plan's device */
    uint64_t stream;        /* the stream a plan with a split-K / stream-K workspace is bound to */
    uint64_t extent[MAX_ITEMS]; /* bytes each tensor item spans (0: not checked) */
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t smem;
    uint32_t flags;         /* PLAN_* */
    int32_t device;
    int32_t out;            /* item index of the output, which must overlap no other item; -1: no check */
    int32_t slot[MAX_ITEMS];/* byte offset in the parameter block of each tensor's pointer, -1: none */
    uint32_t params_len;
    uint8_t params[PARAM_BYTES];
    uint32_t pad;
} Plan;

_Static_assert(sizeof(Plan) == 464, "Plan must match chord.launch's struct layout");

/* cuda.h's CUlaunchAttribute (id padded to 8 bytes, 64-byte value union) and CUlaunchConfig */
typedef struct { int id; char pad[4]; int value[16]; } LaunchAttr;
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, smem;
    void *stream;
    LaunchAttr *attrs;
    unsigned num_attrs;
} LaunchCfg;
_Static_assert(sizeof(LaunchAttr) == 72, "CUlaunchAttribute is 72 bytes");
_Static_assert(sizeof(LaunchCfg) == 56, "CUlaunchConfig is 56 bytes");
#define ATTR_PROGRAMMATIC_STREAM_SERIALIZATION 6

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);
typedef int (*launch_ex_fn)(const LaunchCfg *, void *, void **, void **);

static launch_fn g_launch = NULL;
static launch_ex_fn g_launch_ex = NULL;
static PyObject *g_raw_stream = NULL;   /* torch._C._cuda_getCurrentRawStream */
static PyTypeObject *g_types[2] = {NULL, NULL};  /* torch.Tensor, torch.nn.Parameter */
static PyObject *s_dtype, *s_shape, *s_stride, *s_data_ptr, *s_get_device, *s_is_cuda;

/* Signature of (schedule, *items) into sig[] and each tensor's data pointer into ptrs[];
 * returns the number of words, 0 when an item is not eligible, -1 with an exception set. */
static Py_ssize_t read_signature(PyObject *const *items, Py_ssize_t n, int64_t *sig, uint64_t *ptrs) {
    Py_ssize_t w = 0;
    if (n > MAX_ITEMS) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = items[i];
        ptrs[i] = 0;
        if (PyLong_CheckExact(o)) {
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
            if (overflow) return 0;
            if (v == -1 && PyErr_Occurred()) return -1;
            sig[w++] = 1;
            sig[w++] = v;
            continue;
        }
        if (Py_TYPE(o) != g_types[0] && Py_TYPE(o) != g_types[1]) return 0;
        PyObject *dtype = PyObject_GetAttr(o, s_dtype);
        if (!dtype) return -1;
        sig[w++] = 2;
        sig[w++] = (int64_t)(uintptr_t)dtype;  /* a singleton: its address names it */
        Py_DECREF(dtype);
        PyObject *v = PyObject_CallMethodNoArgs(o, s_get_device);
        if (!v) return -1;
        sig[w++] = PyLong_AsLongLong(v);
        Py_DECREF(v);
        v = PyObject_GetAttr(o, s_is_cuda);
        if (!v) return -1;
        sig[w++] = v == Py_True;
        Py_DECREF(v);
        PyObject *shape = PyObject_GetAttr(o, s_shape);
        if (!shape) return -1;
        PyObject *stride = PyObject_CallMethodNoArgs(o, s_stride);
        if (!stride) { Py_DECREF(shape); return -1; }
        Py_ssize_t nd = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;
        if (nd < 0 || nd > MAX_DIMS || !PyTuple_Check(stride) || PyTuple_GET_SIZE(stride) != nd) {
            Py_DECREF(shape); Py_DECREF(stride);
            return 0;
        }
        sig[w++] = nd;
        for (Py_ssize_t d = 0; d < nd; d++) {
            sig[w++] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
            sig[w++] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, d));
        }
        Py_DECREF(shape);
        Py_DECREF(stride);
        if (PyErr_Occurred()) return -1;
        v = PyObject_CallMethodNoArgs(o, s_data_ptr);
        if (!v) return -1;
        ptrs[i] = PyLong_AsUnsignedLongLong(v);
        Py_DECREF(v);
        if (PyErr_Occurred()) return -1;
        sig[w++] = (int64_t)(ptrs[i] & 15);
    }
    return w;
}

/* The dictionary key of a call: (schedule, bytes of its signature); Py_None when not eligible. */
static PyObject *make_key(PyObject *schedule, PyObject *const *items, Py_ssize_t n, uint64_t *ptrs) {
    int64_t sig[SIG_WORDS];
    if (!PyUnicode_CheckExact(schedule)) Py_RETURN_NONE;
    Py_ssize_t w = read_signature(items, n, sig, ptrs);
    if (w < 0) return NULL;
    if (w == 0) Py_RETURN_NONE;
    PyObject *b = PyBytes_FromStringAndSize((const char *)sig, w * (Py_ssize_t)sizeof(int64_t));
    if (!b) return NULL;
    PyObject *key = PyTuple_Pack(2, schedule, b);
    Py_DECREF(b);
    return key;
}

/* signature(schedule, *items) -> key or None: the key launch() looks plans up by. */
static PyObject *py_signature(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t ptrs[MAX_ITEMS];
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "signature(schedule, *items): schedule is missing");
        return NULL;
    }
    return make_key(args[0], args + 1, nargs - 1, ptrs);
}

/* launch(plans, schedule, *items) -> None (launched, or nothing to launch), False (a miss: take
 * the Python path) or the CUresult of a failed launch (an int). */
static PyObject *py_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t ptrs[MAX_ITEMS];
    if (nargs < 2 || !PyDict_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "launch(plans: dict, schedule, *items)");
        return NULL;
    }
    if (!g_launch || !g_raw_stream) Py_RETURN_FALSE;
    PyObject *key = make_key(args[1], args + 2, nargs - 2, ptrs);
    if (!key) return NULL;
    if (key == Py_None) { Py_DECREF(key); Py_RETURN_FALSE; }
    PyObject *packed = PyDict_GetItemWithError(args[0], key);  /* borrowed */
    Py_DECREF(key);
    if (!packed) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_FALSE;
    }
    if (!PyBytes_CheckExact(packed) || PyBytes_GET_SIZE(packed) != (Py_ssize_t)sizeof(Plan)) {
        PyErr_SetString(PyExc_ValueError, "chord launch plan: not a packed Plan");
        return NULL;
    }
    Plan plan;
    memcpy(&plan, PyBytes_AS_STRING(packed), sizeof(Plan));
    Py_ssize_t n = nargs - 2;
    if (plan.out >= 0) {
        if (plan.out >= n || n > MAX_ITEMS) Py_RETURN_FALSE;
        uint64_t a = ptrs[plan.out], ea = plan.extent[plan.out];
        for (Py_ssize_t i = 0; ea && i < n; i++) {
            uint64_t b = ptrs[i], eb = plan.extent[i];
            if (i != plan.out && eb && a < b + eb && b < a + ea)
                Py_RETURN_FALSE;  /* the Python path raises the error naming the arguments */
        }
    }
    if (plan.flags & PLAN_NOOP) Py_RETURN_NONE;
    PyObject *dev = PyLong_FromLong(plan.device);
    if (!dev) return NULL;
    PyObject *sv = PyObject_CallOneArg(g_raw_stream, dev);
    Py_DECREF(dev);
    if (!sv) return NULL;
    uint64_t stream = PyLong_AsUnsignedLongLong(sv);
    Py_DECREF(sv);
    if (PyErr_Occurred()) return NULL;
    if ((plan.flags & PLAN_STREAM_BOUND) && stream != plan.stream) Py_RETURN_FALSE;

    _Alignas(16) uint8_t buf[PARAM_BYTES];
    if (plan.params_len > PARAM_BYTES) {
        PyErr_SetString(PyExc_ValueError, "chord launch plan: parameter block too long");
        return NULL;
    }
    memcpy(buf, plan.params, plan.params_len);
    for (Py_ssize_t i = 0; i < n && i < MAX_ITEMS; i++) {
        int32_t off = plan.slot[i];
        if (off >= 0) {
            if ((uint32_t)off + 8 > plan.params_len) {
                PyErr_SetString(PyExc_ValueError, "chord launch plan: pointer slot outside the parameter block");
                return NULL;
            }
            memcpy(buf + off, &ptrs[i], 8);
        }
    }
    void *kargs[1] = {buf};
    int rc;
    if (plan.flags & PLAN_PDL) {
        if (!g_launch_ex) Py_RETURN_FALSE;
        LaunchAttr attr;
        memset(&attr, 0, sizeof attr);
        attr.id = ATTR_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value[0] = 1;
        LaunchCfg cfg = {plan.grid[0], plan.grid[1], plan.grid[2], plan.block[0], plan.block[1], plan.block[2],
                         plan.smem, (void *)(uintptr_t)stream, &attr, 1};
        Py_BEGIN_ALLOW_THREADS
        rc = g_launch_ex(&cfg, (void *)(uintptr_t)plan.func, kargs, NULL);
        Py_END_ALLOW_THREADS
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = g_launch((void *)(uintptr_t)plan.func, plan.grid[0], plan.grid[1], plan.grid[2], plan.block[0],
                      plan.block[1], plan.block[2], plan.smem, (void *)(uintptr_t)stream, kargs, NULL);
        Py_END_ALLOW_THREADS
    }
    if (rc) return PyLong_FromLong(rc);
    Py_RETURN_NONE;
}

/* configure(cuLaunchKernel address, cuLaunchKernelEx address or 0, raw_stream, (Tensor, Parameter)) */
static PyObject *py_configure(PyObject *self, PyObject *args) {
    unsigned long long launch, launch_ex;
    PyObject *raw_stream, *types;
    if (!PyArg_ParseTuple(args, "KKOO!", &launch, &launch_ex, &raw_stream, &PyTuple_Type, &types)) return NULL;
    if (!PyCallable_Check(raw_stream)) {
        PyErr_SetString(PyExc_TypeError, "configure: raw_stream must be callable");
        return NULL;
    }
    if (PyTuple_GET_SIZE(types) != 2 || !PyType_Check(PyTuple_GET_ITEM(types, 0))
        || !PyType_Check(PyTuple_GET_ITEM(types, 1))) {
        PyErr_SetString(PyExc_TypeError, "configure: types must be a tuple of two types");
        return NULL;
    }
    Py_XDECREF(g_raw_stream);
    Py_INCREF(raw_stream);
    g_raw_stream = raw_stream;
    for (int i = 0; i < 2; i++) {
        PyObject *t = PyTuple_GET_ITEM(types, i);
        Py_INCREF(t);
        Py_XDECREF((PyObject *)g_types[i]);
        g_types[i] = (PyTypeObject *)t;
    }
    g_launch = (launch_fn)(uintptr_t)launch;
    g_launch_ex = (launch_ex_fn)(uintptr_t)launch_ex;
    Py_RETURN_NONE;
}

static PyObject *py_plan_bytes(PyObject *self, PyObject *unused) {
    return PyLong_FromSize_t(sizeof(Plan));
}

static PyMethodDef methods[] = {
    {"signature", (PyCFunction)(void (*)(void))py_signature, METH_FASTCALL,
     "signature(schedule, *items) -> the plan key of a call, or None when an item is not eligible"},
    {"launch", (PyCFunction)(void (*)(void))py_launch, METH_FASTCALL,
     "launch(plans, schedule, *items) -> None (launched), False (no plan: take the Python path) or a CUresult"},
    {"configure", py_configure, METH_VARARGS,
     "configure(cuLaunchKernel, cuLaunchKernelEx, raw_stream, (Tensor, Parameter))"},
    {"plan_bytes", py_plan_bytes, METH_NOARGS, "sizeof(Plan)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chord_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chord_launch(void) {
    s_dtype = PyUnicode_InternFromString("dtype");
    s_shape = PyUnicode_InternFromString("shape");
    s_stride = PyUnicode_InternFromString("stride");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_get_device = PyUnicode_InternFromString("get_device");
    s_is_cuda = PyUnicode_InternFromString("is_cuda");
    if (!s_dtype || !s_shape || !s_stride || !s_data_ptr || !s_get_device || !s_is_cuda) return NULL;
    return PyModule_Create(&module);
}
