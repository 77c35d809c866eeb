/* What the sources of the _sketch module share: _decide.c's entry points, added to the module by
 * its init, and the loops of _sketch.c that the compiled decision calls as they are. */
#ifndef NEARDUP_DECIDE_H
#define NEARDUP_DECIDE_H

#include <Python.h>
#include <stdint.h>

extern PyMethodDef decide_methods[];

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

/* The unsigned LEB128 varint at data[*at] into `out`, `at` moved past it; NULL, or what is wrong
 * with it (it runs past the end, or past 64 bits). */
const char *varint_at(const uint8_t *data, Py_ssize_t len, Py_ssize_t *at, uint64_t *out);

#endif
