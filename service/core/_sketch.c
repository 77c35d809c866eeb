/* The per-shingle loops of signing and verification in C: the same arithmetic as the numpy code in
 * minhash.py and shingle.py (which stays the reference, and the fallback where this module is not
 * built), in one pass over the data instead of a dozen array passes with their temporaries.
 *
 * oph_minima(units, k, seed_key, minima) -> distinct
 *     units: uint64 buffer (code points or word hashes), at least k of them. For every window of k
 *     units: the polynomial shingle hash (shingle.py: h = h * POLY + unit, mod 2**64), permuted by
 *     fmix64(h ^ seed_key) (minhash.py: _permuted), kept in `minima` (a writable uint64 buffer of
 *     num_bins items, filled with EMPTY_SLOT by the caller) if it is the least of its bin
 *     (minhash.py: _bin_minima). Returns the number of distinct shingle hashes.
 *
 * agreements(query, others, empty) -> (matches, both_empty)
 *     query: uint8 buffer of m verifier slots; others: a sequence of uint8 buffers of m slots each.
 *     For each of the others, the slots equal to the query's and, of those, the slots empty in both
 *     (== empty): the two counts estimate_jaccard_verified_many (minhash.py) starts from, as two
 *     bytes objects of native int64 (np.frombuffer reads them without a copy).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#define POLY 0x9E3779B97F4A7C15ULL

static inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDULL;
    k ^= k >> 33;
    k *= 0xC4CEB9FE1A85EC53ULL;
    k ^= k >> 33;
    return k;
}

/* Distinct values among `count` well-mixed 64-bit values: an open-addressing set indexed by their
 * low bits (fmix64 output, so no further hashing), zero counted on the side. */
static Py_ssize_t count_distinct(const uint64_t *values, Py_ssize_t count, int *failed) {
    size_t capacity = 16;
    while (capacity < (size_t)count * 2) {
        capacity <<= 1;
    }
    uint64_t *slots = calloc(capacity, sizeof(uint64_t));
    if (slots == NULL) {
        *failed = 1;
        return 0;
    }
    size_t mask = capacity - 1;
    Py_ssize_t distinct = 0;
    int seen_zero = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t value = values[i];
        if (value == 0) {
            if (!seen_zero) {
                seen_zero = 1;
                distinct++;
            }
            continue;
        }
        size_t at = (size_t)value & mask;
        while (slots[at] != 0 && slots[at] != value) {
            at = (at + 1) & mask;
        }
        if (slots[at] == 0) {
            slots[at] = value;
            distinct++;
        }
    }
    free(slots);
    return distinct;
}

static PyObject *oph_minima(PyObject *self, PyObject *args) {
    Py_buffer units, minima;
    Py_ssize_t k;
    unsigned long long seed_key;
    if (!PyArg_ParseTuple(args, "y*nKw*", &units, &k, &seed_key, &minima)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t count = units.len / 8;
    Py_ssize_t bins = minima.len / 8;
    if (units.len % 8 || minima.len % 8 || bins < 1 || bins > 65536) {
        PyErr_SetString(PyExc_ValueError, "units and minima must be uint64 buffers (1..65536 bins)");
        goto done;
    }
    if (k < 1 || count < k) {
        PyErr_SetString(PyExc_ValueError, "need k >= 1 and at least k units");
        goto done;
    }
    const uint64_t *unit = (const uint64_t *)units.buf;
    uint64_t *minimum = (uint64_t *)minima.buf;
    Py_ssize_t windows = count - k + 1;
    uint64_t *permuted = malloc((size_t)windows * sizeof(uint64_t));
    if (permuted == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < windows; i++) {
        uint64_t hash = unit[i];
        for (Py_ssize_t j = 1; j < k; j++) {
            hash = hash * POLY + unit[i + j];
        }
        uint64_t value = fmix64(hash ^ (uint64_t)seed_key);
        uint64_t bin = ((value >> 32) * (uint64_t)bins) >> 32;
        if (value < minimum[bin]) {
            minimum[bin] = value;
        }
        permuted[i] = value;
    }
    int failed = 0;
    Py_ssize_t distinct = count_distinct(permuted, windows, &failed);
    free(permuted);
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyLong_FromSsize_t(distinct);
done:
    PyBuffer_Release(&units);
    PyBuffer_Release(&minima);
    return result;
}

static PyObject *agreements(PyObject *self, PyObject *args) {
    Py_buffer query;
    PyObject *others;
    int empty;
    if (!PyArg_ParseTuple(args, "y*Oi", &query, &others, &empty)) {
        return NULL;
    }
    PyObject *result = NULL, *matches = NULL, *both_empty = NULL;
    PyObject *sequence = PySequence_Fast(others, "others must be a sequence of buffers");
    if (sequence == NULL) {
        goto done;
    }
    Py_ssize_t rows = PySequence_Fast_GET_SIZE(sequence);
    matches = PyBytes_FromStringAndSize(NULL, rows * (Py_ssize_t)sizeof(int64_t));
    both_empty = PyBytes_FromStringAndSize(NULL, rows * (Py_ssize_t)sizeof(int64_t));
    if (matches == NULL || both_empty == NULL) {
        goto done;
    }
    int64_t *match_count = (int64_t *)PyBytes_AS_STRING(matches);
    int64_t *empty_count = (int64_t *)PyBytes_AS_STRING(both_empty);
    const uint8_t *mine = (const uint8_t *)query.buf;
    Py_ssize_t size = query.len;
    for (Py_ssize_t row = 0; row < rows; row++) {
        Py_buffer other;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(sequence, row), &other, PyBUF_SIMPLE) < 0) {
            goto done;
        }
        if (other.len != size) {
            PyBuffer_Release(&other);
            PyErr_SetString(PyExc_ValueError, "verifiers differ in length");
            goto done;
        }
        const uint8_t *theirs = (const uint8_t *)other.buf;
        int64_t equal = 0, empty_in_both = 0;
        for (Py_ssize_t slot = 0; slot < size; slot++) {
            if (mine[slot] == theirs[slot]) {
                equal++;
                empty_in_both += mine[slot] == (uint8_t)empty;
            }
        }
        PyBuffer_Release(&other);
        match_count[row] = equal;
        empty_count[row] = empty_in_both;
    }
    result = PyTuple_Pack(2, matches, both_empty);
done:
    Py_XDECREF(matches);
    Py_XDECREF(both_empty);
    Py_XDECREF(sequence);
    PyBuffer_Release(&query);
    return result;
}

static PyMethodDef methods[] = {
    {"oph_minima", oph_minima, METH_VARARGS, "Shingle, permute and keep each bin's minimum; returns the distinct count."},
    {"agreements", agreements, METH_VARARGS, "Equal slots, and of those empty ones, of a verifier against others."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sketch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sketch(void) { return PyModule_Create(&module); }
