/* The index shard's rules for each article, compiled beside the decision so that no Python code
 * runs per article from a signatures message to its verdict and changelog writes: the records of a
 * message decoded, where the decider process is (its marker), which input is applied already, the
 * time an article counts under and the cutoff it is decided against, its latency, the compiled
 * run's rows and then its results. pipeline/shard.py is their shell, and calls input_key, replayed
 * and latency_ms for the articles no run takes, so that each rule is written here once; the Python
 * loop they replace is kept as the reference the tests compare them with
 * (tests/support/reference_shard.py).
 *
 * input_key(provenance) -> str
 *     The applied inputs' key of the partition an article came from: "topic:partition".
 * replayed(provenance, offset, applied_offset, inputs) -> bool
 *     Whether the article's input is applied already: its signatures message (`offset`), or its
 *     offset in its input partition (`inputs`: the offsets applied, by input_key).
 * latency_ms(timestamp_ms or None, now_ms) -> float or None
 *     Milliseconds from the article's message to its verdict, rounded to 3 decimals as round()
 *     rounds them, 0.0 at least; None where the message has no time.
 * mark(memory, offset, index, deciding), marked(memory) -> (offset, index, deciding)
 *     The decider's marker (pipeline/decider.py: RecordMarker): three little-endian int64 at the
 *     start of a writable buffer the worker maps too.
 * mark_deciding(memory, offset, indexes, n)
 *     mark(memory, offset, indexes[n], True): IndexShard.decide's `before`, bound to a message by
 *     functools.partial, which calls it with no Python code run.
 * signed_records(message, signed_type, provenance_type, memory or None, offset) -> (records, left)
 *     A signatures message's records (wire.unpack_signed), each decoded as _decide.c's
 *     signed_record decodes it where it can, else left as its bytes (`left` counts those); each
 *     marked (offset, index, not deciding) as its decoding starts. None for a message of any other
 *     shape, which unpack_signed reads or refuses.
 * fresh_rows(items, shell) -> (rows, keys)
 *     The rows (state/index.py's FreshRow) of the articles a compiled run may take, from the first
 *     of `items` (wire.Signed), and each one's input key (input_key): it stops before a deletion
 *     (an item not of `signed_type`) or an input applied already, and after one whose time makes
 *     an expiry pass due. shell:
 *     (signed_type, offset, applied_offset, inputs (updated as the run moves them), newest_ms or
 *     None, now_ms (float), latest_ms (the latest event time taken: the clock plus the skew),
 *     window_ms (0: nothing expires), due_ms (the cutoff from which an expiry pass is due:
 *     Retention.due_from) or None, bands, rows).
 * fresh_results(items, (rows, keys), written, shell) -> (results, refused)
 *     What the shell makes of the run's results (IndexState.add_fresh's (record, verdict, kind,
 *     revived), the first of fresh_rows's rows): each a `template` (a pipeline.shard.Decided) with
 *     the article's id, verdict, kind, latency and its record's index in its message; its input
 *     marked applied; its record, and a revived id's marker tombstone, appended to the changelog's
 *     writes.
 *     shell: (template, inputs or None, changelog (a list) or None, record indexes or None, start
 *     (the index of items[0] in them), article prefix, marker prefix). refused: how many of them
 *     had their time refused. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_decide.h"

#define MARKER_BYTES 24
#define SIGNED_FIELDS 12
/* wire.Signed's fields and wire.Provenance's, by position */
#define F_ID 0
#define F_KEYS 2
#define F_SIGNATURE 4
#define F_PROVENANCE 8
#define F_BANDING 9
#define F_TIME 10
#define F_REFUSED 11
#define P_OFFSET 2
#define P_TIMESTAMP 3
/* pipeline.shard.Decided's fields that a run's result sets, by position */
#define D_FIELDS 11
#define D_ID 1
#define D_VERDICT 3
#define D_KIND 4
#define D_LATENCY 5
#define D_RECORD 8

static int provenance_check(PyObject *src) {
    if (!PyTuple_Check(src) || PyTuple_GET_SIZE(src) != 4) {
        PyErr_SetString(PyExc_TypeError, "a provenance must be a 4-tuple");
        return -1;
    }
    return 0;
}

static PyObject *key_of(PyObject *src) {
    return provenance_check(src) < 0 ? NULL
                                     : PyUnicode_FromFormat("%S:%S", PyTuple_GET_ITEM(src, 0), PyTuple_GET_ITEM(src, 1));
}

static PyObject *input_key(PyObject *self, PyObject *src) {
    (void)self;
    return key_of(src);
}

/* 1 when applied already, 0 when not (its key in *key, a new reference), -1 on failure. */
static int is_replayed(PyObject *src, long long offset, long long applied, PyObject *inputs, PyObject **key) {
    if ((*key = key_of(src)) == NULL) {
        return -1;
    }
    if (offset <= applied) {
        return 1;
    }
    long long at = PyLong_AsLongLong(PyTuple_GET_ITEM(src, P_OFFSET));
    PyObject *done = at == -1 && PyErr_Occurred() ? NULL : PyDict_GetItemWithError(inputs, *key);
    if (PyErr_Occurred()) {
        return -1;
    }
    long long last = done == NULL ? -1 : PyLong_AsLongLong(done);
    return last == -1 && PyErr_Occurred() ? -1 : at <= last;
}

static PyObject *replayed(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *src, *inputs, *key = NULL;
    long long offset, applied;
    if (!PyArg_ParseTuple(args, "OLLO!", &src, &offset, &applied, &PyDict_Type, &inputs)) {
        return NULL;
    }
    int applied_already = is_replayed(src, offset, applied, inputs, &key);
    Py_XDECREF(key);
    return applied_already < 0 ? NULL : PyBool_FromLong(applied_already);
}

/* round(max(now_ms - sent, 0.0), 3) as Python computes it: the value rounded to 3 decimal places
 * by the same dtoa (correctly rounded, ties to even), read back. */
static PyObject *latency_of(PyObject *timestamp, double now_ms) {
    if (timestamp == Py_None) {
        return Py_NewRef(Py_None);
    }
    long long sent = PyLong_AsLongLong(timestamp);
    if (sent == -1 && PyErr_Occurred()) {
        return NULL;
    }
    double waited = now_ms - (double)sent;
    char *text = PyOS_double_to_string(waited > 0.0 ? waited : 0.0, 'f', 3, 0, NULL);
    if (text == NULL) {
        return NULL;
    }
    double rounded = PyOS_string_to_double(text, NULL, NULL);
    PyMem_Free(text);
    return rounded == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(rounded);
}

static PyObject *latency_ms(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *timestamp;
    double now_ms;
    return PyArg_ParseTuple(args, "Od", &timestamp, &now_ms) ? latency_of(timestamp, now_ms) : NULL;
}

/* -- the decider's marker ------------------------------------------------------------------ */

static int marker_write(PyObject *memory, long long offset, long long index, int deciding) {
    Py_buffer view;
    if (PyObject_GetBuffer(memory, &view, PyBUF_WRITABLE) < 0) {
        return -1;
    }
    int fits = view.len >= MARKER_BYTES;
    if (fits) {
        uint64_t values[3] = {(uint64_t)offset, (uint64_t)index, (uint64_t)(deciding != 0)};
        unsigned char *out = view.buf;
        for (int i = 0; i < 3; i++) {
            for (int k = 0; k < 8; k++) {
                out[8 * i + k] = (unsigned char)(values[i] >> (8 * k));
            }
        }
    }
    PyBuffer_Release(&view);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "a marker holds 24 bytes");
        return -1;
    }
    return 0;
}

static PyObject *mark(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *memory;
    long long offset, index;
    int deciding;
    if (!PyArg_ParseTuple(args, "OLLp", &memory, &offset, &index, &deciding) ||
        marker_write(memory, offset, index, deciding) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *marked(PyObject *self, PyObject *memory) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(memory, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint64_t values[3] = {0, 0, 0};
    for (int i = 0; i < 3 && view.len >= MARKER_BYTES; i++) {
        for (int k = 7; k >= 0; k--) {
            values[i] = values[i] << 8 | ((const unsigned char *)view.buf)[8 * i + k];
        }
    }
    Py_ssize_t len = view.len;
    PyBuffer_Release(&view);
    if (len < MARKER_BYTES) {
        PyErr_SetString(PyExc_ValueError, "a marker holds 24 bytes");
        return NULL;
    }
    return Py_BuildValue("(LLO)", (long long)values[0], (long long)values[1], values[2] ? Py_True : Py_False);
}

static PyObject *mark_deciding(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *memory, *indexes;
    long long offset;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OLOn", &memory, &offset, &indexes, &n)) {
        return NULL;
    }
    PyObject *index = PySequence_GetItem(indexes, n);
    long long at = index == NULL ? -1 : PyLong_AsLongLong(index);
    Py_XDECREF(index);
    if ((at == -1 && PyErr_Occurred()) || marker_write(memory, offset, at, 1) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* -- a signatures message ------------------------------------------------------------------ */

static PyObject *signed_records(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    PyTypeObject *signed_type, *provenance_type;
    PyObject *memory;
    long long offset;
    if (!PyArg_ParseTuple(args, "y*O!O!OL", &view, &PyType_Type, &signed_type, &PyType_Type, &provenance_type,
                          &memory, &offset)) {
        return NULL;
    }
    const char *data = view.buf;
    Py_ssize_t len = view.len, count = 1, at = 0, left = 0;
    PyObject *records = NULL, *result = NULL;
    if (tuple_types(signed_type, provenance_type) < 0) {
        goto done;
    }
    int packed = len >= 6 && memcmp(data, "SP", 2) == 0;
    if (packed) {
        count = (Py_ssize_t)get_be(data + 2, 4), at = 6;
        /* the sizes first: a message that does not add up is unpack_signed's to refuse */
        Py_ssize_t end = at;
        for (Py_ssize_t i = 0; i < count && end <= len; i++) {
            end = end <= len - 4 ? end + 4 + (Py_ssize_t)get_be(data + end, 4) : len + 1;
        }
        if (end != len) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    } else if (len < 2 || memcmp(data, "S6", 2) != 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if ((records = PyList_New(count)) == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t size = packed ? (Py_ssize_t)get_be(data + at, 4) : len;
        at += packed ? 4 : 0;
        if (memory != Py_None && marker_write(memory, offset, i, 0) < 0) {
            goto done;
        }
        PyObject *record = signed_from(data + at, size, signed_type, provenance_type);
        if (record == Py_None) {
            Py_DECREF(record);
            record = PyBytes_FromStringAndSize(data + at, size);
            left++;
        }
        if (record == NULL) {
            goto done;
        }
        PyList_SET_ITEM(records, i, record);
        at += size;
    }
    result = Py_BuildValue("(On)", records, left);
done:
    Py_XDECREF(records);
    PyBuffer_Release(&view);
    return result;
}

/* -- a run's rows and results ---------------------------------------------------------------- */

typedef struct {
    PyTypeObject *signed_type;
    PyObject *inputs, *banding; /* banding: (bands, rows), made once for the run */
    long long offset, applied, newest, latest, window, due, bands, rows;
    int has_newest, has_due;
    double now_ms;
} Shell;

static int optional_ll(PyObject *value, long long *out, int *present) {
    *present = value != Py_None;
    *out = *present ? PyLong_AsLongLong(value) : 0;
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int shell_read(Shell *s, PyObject *shell) {
    PyObject *newest, *due;
    if (!PyArg_ParseTuple(shell, "O!LLO!OdLLOLL", &PyType_Type, &s->signed_type, &s->offset, &s->applied, &PyDict_Type,
                          &s->inputs, &newest, &s->now_ms, &s->latest, &s->window, &due, &s->bands, &s->rows)) {
        return -1;
    }
    if (optional_ll(newest, &s->newest, &s->has_newest) < 0 || optional_ll(due, &s->due, &s->has_due) < 0) {
        return -1;
    }
    return (s->banding = Py_BuildValue("(LL)", s->bands, s->rows)) == NULL ? -1 : 0;
}

/* The item's band keys: those it carries when computed for this banding, else computed from its
 * signature (lsh.band_keys, which hashes the values' bytes in the machine's order). */
static PyObject *keys_for(Shell *s, PyObject *item) {
    PyObject *keys = PyTuple_GET_ITEM(item, F_KEYS);
    int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(item, F_BANDING), s->banding, Py_EQ);
    if (same < 0) {
        return NULL;
    }
    if (same && PyTuple_Check(keys) && PyTuple_GET_SIZE(keys)) {
        return Py_NewRef(keys);
    }
    PyObject *signature = PyTuple_GET_ITEM(item, F_SIGNATURE);
#if PY_BIG_ENDIAN
    /* the record's values are little-endian: the machine's order first */
    if (!PyBytes_Check(signature)) {
        PyErr_SetString(PyExc_TypeError, "a signature must be bytes");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(signature);
    PyObject *native = PyBytes_FromStringAndSize(NULL, n);
    for (Py_ssize_t i = 0; native != NULL && i < n; i++) {
        PyBytes_AS_STRING(native)[i] = PyBytes_AS_STRING(signature)[i - i % 8 + 7 - i % 8];
    }
    PyObject *args = native == NULL ? NULL : Py_BuildValue("(NLL)", native, s->bands, s->rows);
#else
    PyObject *args = Py_BuildValue("(OLL)", signature, s->bands, s->rows);
#endif
    PyObject *computed = args == NULL ? NULL : band_keys(NULL, args);
    Py_XDECREF(args);
    PyObject *tuple = computed == NULL ? NULL : PyList_AsTuple(computed);
    Py_XDECREF(computed);
    return tuple;
}

/* The article's row, or NULL. Its time: a refused one is taken as the newest time the index
 * holds (the stream's time), so that it cannot move it: a time far ahead would expire a whole
 * backfill, one far behind expire the article at once; only while the index holds none is it the
 * signer's fallback. No time runs ahead of the clock by more than the skew (`latest`), whatever a
 * signer's clock said. The record keeps the time taken: a replay of the changelog repeats it. */
static PyObject *row_of(Shell *s, PyObject *item) {
    long long time_ms = PyLong_AsLongLong(PyTuple_GET_ITEM(item, F_TIME));
    int refused = PyObject_IsTrue(PyTuple_GET_ITEM(item, F_REFUSED));
    if ((time_ms == -1 && PyErr_Occurred()) || refused < 0) {
        return NULL;
    }
    time_ms = refused && s->has_newest ? s->newest : time_ms < s->latest ? time_ms : s->latest;
    s->newest = s->has_newest && s->newest > time_ms ? s->newest : time_ms;
    s->has_newest = 1;
    /* the retention cutoff (Retention.cutoff) of the newest time with this article's */
    PyObject *cutoff = s->window > 0 ? PyLong_FromLongLong(s->newest - s->window) : Py_NewRef(Py_None);
    PyObject *keys = cutoff == NULL ? NULL : keys_for(s, item);
    PyObject *src = PyTuple_GET_ITEM(item, F_PROVENANCE);
    PyObject *latency = keys == NULL ? NULL : latency_of(PyTuple_GET_ITEM(src, P_TIMESTAMP), s->now_ms);
    PyObject *row = latency == NULL ? NULL : PyTuple_New(11);
    if (row != NULL) {
        for (int i = 0; i < 8; i++) {
            PyTuple_SET_ITEM(row, i, Py_NewRef(i == F_KEYS ? keys : PyTuple_GET_ITEM(item, i)));
        }
        PyObject *time_taken = PyLong_FromLongLong(time_ms);
        if (time_taken == NULL) {
            Py_CLEAR(row);
        } else {
            PyTuple_SET_ITEM(row, 8, time_taken);
            PyTuple_SET_ITEM(row, 9, Py_NewRef(cutoff));
            PyTuple_SET_ITEM(row, 10, Py_NewRef(latency));
        }
    }
    Py_XDECREF(cutoff);
    Py_XDECREF(keys);
    Py_XDECREF(latency);
    return row;
}

static PyObject *fresh_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *items, *shell;
    Shell s;
    if (!PyArg_ParseTuple(args, "OO!", &items, &PyTuple_Type, &shell) || shell_read(&s, shell) < 0) {
        return NULL;
    }
    PyObject *sequence = PySequence_Fast(items, "items must be a sequence");
    PyObject *rows = sequence == NULL ? NULL : PyList_New(0), *keys = rows == NULL ? NULL : PyList_New(0);
    for (Py_ssize_t i = 0; keys != NULL && i < PySequence_Fast_GET_SIZE(sequence); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(sequence, i), *key = NULL;
        if (Py_TYPE(item) != s.signed_type) {
            break; /* a deletion: the shell answers it */
        }
        if (PyTuple_GET_SIZE(item) != SIGNED_FIELDS || !PyUnicode_Check(PyTuple_GET_ITEM(item, F_ID))) {
            PyErr_SetString(PyExc_TypeError, "a signed record has 12 fields, an id first");
            Py_CLEAR(keys);
            break;
        }
        PyObject *src = PyTuple_GET_ITEM(item, F_PROVENANCE);
        int applied = provenance_check(src) < 0 ? -1 : s.offset >= 0 ? is_replayed(src, s.offset, s.applied, s.inputs, &key) : 0;
        if (applied == 0 && key == NULL) {
            key = key_of(src);
        }
        int failed = applied < 0 || key == NULL;
        if (!failed && applied) {
            Py_DECREF(key);
            break;
        }
        PyObject *row = failed || PyDict_SetItem(s.inputs, key, PyTuple_GET_ITEM(src, P_OFFSET)) < 0 ? NULL : row_of(&s, item);
        failed = row == NULL || PyList_Append(rows, row) < 0 || PyList_Append(keys, key) < 0;
        Py_XDECREF(row);
        Py_XDECREF(key);
        if (failed) {
            Py_CLEAR(keys);
            break;
        }
        if (s.has_due && s.window > 0 && s.newest - s.window >= s.due) {
            break; /* the expiry pass it makes due runs before the next article is decided */
        }
    }
    Py_XDECREF(sequence);
    Py_DECREF(s.banding);
    PyObject *result = keys == NULL ? NULL : PyTuple_Pack(2, rows, keys);
    Py_XDECREF(rows);
    Py_XDECREF(keys);
    return result;
}

static PyObject *id_key(PyObject *prefix, PyObject *id) {
    Py_ssize_t n;
    const char *text = PyUnicode_AsUTF8AndSize(id, &n);
    PyObject *key = text == NULL ? NULL : PyBytes_FromStringAndSize(NULL, PyBytes_GET_SIZE(prefix) + n);
    if (key != NULL) {
        memcpy(PyBytes_AS_STRING(key), PyBytes_AS_STRING(prefix), (size_t)PyBytes_GET_SIZE(prefix));
        memcpy(PyBytes_AS_STRING(key) + PyBytes_GET_SIZE(prefix), text, (size_t)n);
    }
    return key;
}

static int logged(PyObject *changelog, PyObject *prefix, PyObject *id, PyObject *value) {
    PyObject *key = id_key(prefix, id);
    PyObject *write = key == NULL ? NULL : PyTuple_Pack(2, key, value);
    int failed = write == NULL || PyList_Append(changelog, write) < 0;
    Py_XDECREF(key);
    Py_XDECREF(write);
    return failed ? -1 : 0;
}

static PyObject *fresh_results(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *items, *rows, *keys, *written, *template, *inputs, *changelog, *records, *article_prefix, *marker_prefix;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O(O!O!)O!(O!OOOnO!O!)", &items, &PyList_Type, &rows, &PyList_Type, &keys, &PyList_Type,
                          &written, &PyTuple_Type, &template, &inputs, &changelog, &records, &start, &PyBytes_Type,
                          &article_prefix, &PyBytes_Type, &marker_prefix)) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(template) != D_FIELDS || (inputs != Py_None && !PyDict_Check(inputs)) ||
        (changelog != Py_None && !PyList_Check(changelog)) || PyList_GET_SIZE(written) > PyList_GET_SIZE(rows) ||
        PyList_GET_SIZE(keys) != PyList_GET_SIZE(rows)) {
        PyErr_SetString(PyExc_TypeError, "fresh_results: a Decided template, a dict of inputs, a list of writes, a key per row");
        return NULL;
    }
    PyObject *sequence = PySequence_Fast(items, "items must be a sequence");
    Py_ssize_t count = PyList_GET_SIZE(written);
    if (sequence != NULL && PySequence_Fast_GET_SIZE(sequence) < count) {
        PyErr_SetString(PyExc_ValueError, "fresh_results: fewer items than results");
        Py_CLEAR(sequence);
    }
    PyObject *results = sequence == NULL ? NULL : PyList_New(count);
    long long refused = 0;
    for (Py_ssize_t i = 0; results != NULL && i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(sequence, i), *result = PyList_GET_ITEM(written, i);
        PyObject *row = PyList_GET_ITEM(rows, i), *fields[D_FIELDS], *index = NULL;
        int failed = !PyTuple_Check(item) || PyTuple_GET_SIZE(item) != SIGNED_FIELDS || !PyTuple_Check(result) ||
                     PyTuple_GET_SIZE(result) != 4 || !PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 11;
        if (failed) {
            PyErr_SetString(PyExc_TypeError, "fresh_results: signed records, their rows and 4-tuple results");
        }
        PyObject *id = failed ? NULL : PyTuple_GET_ITEM(item, F_ID), *src = failed ? NULL : PyTuple_GET_ITEM(item, F_PROVENANCE);
        if (!failed && inputs != Py_None) {
            failed = PyDict_SetItem(inputs, PyList_GET_ITEM(keys, i), PyTuple_GET_ITEM(src, P_OFFSET)) < 0;
        }
        int was_refused = failed ? -1 : PyObject_IsTrue(PyTuple_GET_ITEM(item, F_REFUSED));
        int revived = was_refused < 0 ? -1 : PyObject_IsTrue(PyTuple_GET_ITEM(result, 3));
        failed = revived < 0;
        refused += was_refused > 0;
        if (!failed && changelog != Py_None) {
            failed = logged(changelog, article_prefix, id, PyTuple_GET_ITEM(result, 0)) < 0 ||
                     (revived && logged(changelog, marker_prefix, id, Py_None) < 0);
        }
        if (!failed && records != Py_None) {
            index = PySequence_GetItem(records, start + i);
            failed = index == NULL;
        }
        if (!failed) {
            memcpy(fields, PySequence_Fast_ITEMS(template), sizeof fields);
            fields[D_ID] = id, fields[D_VERDICT] = PyTuple_GET_ITEM(result, 1);
            fields[D_KIND] = PyTuple_GET_ITEM(result, 2), fields[D_LATENCY] = PyTuple_GET_ITEM(row, 10);
            fields[D_RECORD] = index == NULL ? fields[D_RECORD] : index;
        }
        PyObject *decided = failed ? NULL : made(Py_TYPE(template), fields, D_FIELDS);
        Py_XDECREF(index);
        if (decided == NULL) {
            Py_CLEAR(results);
            break;
        }
        PyList_SET_ITEM(results, i, decided);
    }
    Py_XDECREF(sequence);
    return results == NULL ? NULL : Py_BuildValue("(NL)", results, refused);
}

PyMethodDef shard_methods[] = {
    {"input_key", input_key, METH_O, "The applied inputs' key of an article's input partition."},
    {"replayed", replayed, METH_VARARGS, "Whether an article's input is applied already."},
    {"latency_ms", latency_ms, METH_VARARGS, "Milliseconds from an article's message to its verdict."},
    {"mark", mark, METH_VARARGS, "The decider's marker set: (offset, index, deciding)."},
    {"marked", marked, METH_O, "The decider's marker read: (offset, index, deciding)."},
    {"mark_deciding", mark_deciding, METH_VARARGS, "The marker set to the n-th decided record of a message."},
    {"signed_records", signed_records, METH_VARARGS, "A signatures message's records, decoded where they can be."},
    {"fresh_rows", fresh_rows, METH_VARARGS, "The rows of the signed records a compiled run may take."},
    {"fresh_results", fresh_results, METH_VARARGS, "A compiled run's results made into the shard's."},
    {NULL, NULL, 0, NULL},
};
