/* Kafka's key hash in C: the worker partitions every verdict by its article id the way the
 * producer's default partitioner does (aiokafka's DefaultPartitioner, the Java client's
 * Utils.murmur2 and toPositive), which hashes in pure Python: a cost per verdict on the event
 * loop, the worker's one thread for all its Kafka work.
 *
 * murmur2(data) -> int
 *     MurmurHash2 (seed 0x9747B28C) of the bytes, as an unsigned 32-bit value: what
 *     aiokafka.partitioner.murmur2 returns.
 *
 * partitions(keys, count) -> list of int
 *     For each key (bytes), (murmur2(key) & 0x7FFFFFFF) % count: its index among the topic's
 *     partitions, as DefaultPartitioner picks it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static uint32_t kafka_murmur2(const uint8_t *data, Py_ssize_t length) {
    const uint32_t m = 0x5BD1E995;
    const int r = 24;
    uint32_t h = 0x9747B28CU ^ (uint32_t)length;
    Py_ssize_t blocks = length / 4;
    for (Py_ssize_t i = 0; i < blocks; i++) {
        const uint8_t *at = data + 4 * i;
        uint32_t k = (uint32_t)at[0] | ((uint32_t)at[1] << 8) | ((uint32_t)at[2] << 16) | ((uint32_t)at[3] << 24);
        k *= m;
        k ^= k >> r;
        k *= m;
        h *= m;
        h ^= k;
    }
    const uint8_t *tail = data + 4 * blocks;
    switch (length % 4) {
    case 3:
        h ^= (uint32_t)tail[2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)tail[1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)tail[0];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

static PyObject *murmur2(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) {
        return NULL;
    }
    uint32_t hash = kafka_murmur2((const uint8_t *)data.buf, data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(hash);
}

static PyObject *partitions(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *keys;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "On", &keys, &count)) {
        return NULL;
    }
    if (count < 1) {
        PyErr_SetString(PyExc_ValueError, "a topic has at least one partition");
        return NULL;
    }
    PyObject *sequence = PySequence_Fast(keys, "keys must be a sequence");
    if (sequence == NULL) {
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(sequence);
    PyObject *picked = PyList_New(size);
    for (Py_ssize_t i = 0; picked != NULL && i < size; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(sequence, i);
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "every key must be bytes");
            Py_CLEAR(picked);
            break;
        }
        uint32_t hash = kafka_murmur2((const uint8_t *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
        PyObject *index = PyLong_FromSsize_t((Py_ssize_t)(hash & 0x7FFFFFFFU) % count);
        if (index == NULL) {
            Py_CLEAR(picked);
            break;
        }
        PyList_SET_ITEM(picked, i, index);
    }
    Py_DECREF(sequence);
    return picked;
}

static PyMethodDef methods[] = {
    {"murmur2", murmur2, METH_VARARGS, "Kafka's murmur2 hash of the bytes (unsigned 32-bit)."},
    {"partitions", partitions, METH_VARARGS, "Each key's partition index, as Kafka's default partitioner picks it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kafka_hash", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kafka_hash(void) { return PyModule_Create(&module); }
