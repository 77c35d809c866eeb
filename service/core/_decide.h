/* What the sources of the _sketch module share: _decide.c's entry points, added to the module by
 * its init, and the loops of _sketch.c that the compiled decision calls as they are. */
#ifndef NEARDUP_DECIDE_H
#define NEARDUP_DECIDE_H

#include <Python.h>
#include <stdint.h>

extern PyMethodDef decide_methods[];
extern PyMethodDef shard_methods[]; /* _shard.c's */

/* The attribute names _decide.c reads, made once; -1 with an exception set on failure. */
int decide_init(void);

/* _sketch.c's entry points, called with their Python arguments (the comment at its top). */
PyObject *scores(PyObject *self, PyObject *args);
PyObject *rank(PyObject *self, PyObject *args);
PyObject *merge_buckets(PyObject *self, PyObject *args);
PyObject *count_postings(PyObject *self, PyObject *args);
PyObject *passages(PyObject *self, PyObject *args);
PyObject *posting_keys(PyObject *self, PyObject *args);
PyObject *join_postings(PyObject *self, PyObject *args);
PyObject *join_buckets(PyObject *self, PyObject *args);
PyObject *leave_entries(PyObject *self, PyObject *args);
PyObject *band_keys(PyObject *self, PyObject *args);

/* An instance of the tuple type `type` holding `values` (references borrowed), made as
 * tuple.__new__(type, values) makes it: a NamedTuple's fields, with none of its Python run. */
PyObject *made(PyTypeObject *type, PyObject **values, Py_ssize_t count);

/* The signed record data[:len] decoded (_decide.c's signed_record), or None (a new reference) when
 * it is not one as encode_signed writes it; NULL with an exception on failure. */
PyObject *signed_from(const char *data, Py_ssize_t len, PyTypeObject *signed_type, PyTypeObject *provenance_type);

/* The unsigned number in `width` big-endian bytes at `data` (_decide.c's put_be's inverse). */
uint64_t get_be(const char *data, int width);

/* 0 when both are tuple types (what signed_from makes), else -1 with TypeError set. */
int tuple_types(PyTypeObject *signed_type, PyTypeObject *provenance_type);

/* The unsigned LEB128 varint at data[*at] into `out`, `at` moved past it; NULL, or what is wrong
 * with it (it runs past the end, or past 64 bits). */
const char *varint_at(const uint8_t *data, Py_ssize_t len, Py_ssize_t *at, uint64_t *out);

#endif
