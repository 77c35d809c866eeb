/* _codec.c's entry points, added to the _sketch module by its init (_sketch.c). */
#ifndef NEARDUP_CODEC_H
#define NEARDUP_CODEC_H

#include <Python.h>

extern PyMethodDef codec_methods[];

/* The attribute names the codec reads, made once; -1 with an exception set on failure. */
int codec_init(void);

#endif
