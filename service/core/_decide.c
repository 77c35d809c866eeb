/* The bytes an indexed article leaves behind, compiled into _sketch beside its loops: its state
 * record (state/records.py's layout) and its verdict as published (messages.verdict_dict written
 * by orjson). Their Python writers are kept as the references the tests compare these with, byte
 * for byte (tests/support/reference_records.py). Each is written in two steps: the article's
 * fields read into plain C structs (ArticleOut), then the bytes written from those alone, so that
 * a decision made in C can hand its results to the writers without a Python object between.
 *
 * encode_record(article) -> bytes
 *     article: an IndexedArticle (core/dedup.py). Its record: the magic, the head's varints, then
 *     the id, the cluster id (none when it is the article's own), the verifier, the band keys'
 *     digests, the content hash, the decision, the anchors (none for a duplicate) and, without a
 *     verifier, the signature (little-endian). ValueError where records.py raises one (a kind it
 *     does not know, more than 255 candidates, a negative varint), TypeError for a missing score,
 *     OverflowError for a number past 64 bits.
 *
 * verdict_json(article, params, latency_ms) -> bytes
 *     orjson.dumps(verdict_dict(article, params_dict, latency_ms)) where `params` is
 *     orjson.dumps(params_dict), the audit written once: the same keys in the same order, strings
 *     escaped as orjson escapes them, floats in its shortest round-trip form (NaN and infinities
 *     as null). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_decide.h"

/* Sets ValueError(message) and returns -1. */
static int invalid(const char *message) {
    PyErr_SetString(PyExc_ValueError, message);
    return -1;
}

/* -- a growing byte buffer ------------------------------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int grow(Buf *b, Py_ssize_t more) {
    if (b->len + more <= b->cap) {
        return 0;
    }
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more) {
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int put(Buf *b, const void *bytes, Py_ssize_t n) {
    if (n && grow(b, n) < 0) {
        return -1;
    }
    if (n) {
        memcpy(b->data + b->len, bytes, (size_t)n);
        b->len += n;
    }
    return 0;
}

#define PUT_TEXT(b, literal) put((b), (literal), (Py_ssize_t)sizeof(literal) - 1)

static int put_varint(Buf *b, uint64_t value) {
    unsigned char out[10];
    int n = 0;
    while (value > 0x7F) {
        out[n++] = (unsigned char)((value & 0x7F) | 0x80);
        value >>= 7;
    }
    out[n++] = (unsigned char)value;
    return put(b, out, n);
}

static int put_be_double(Buf *b, double value) {
    uint64_t bits;
    memcpy(&bits, &value, 8);
    unsigned char out[8];
    for (int i = 7; i >= 0; i--, bits >>= 8) {
        out[i] = (unsigned char)(bits & 0xFF);
    }
    return put(b, out, 8);
}

static PyObject *finished(Buf *b) {
    PyObject *bytes = PyBytes_FromStringAndSize(b->data ? b->data : "", b->len);
    PyMem_Free(b->data);
    return bytes;
}

/* -- the article as plain C values ---------------------------------------------------------- */

typedef struct {
    const char *text; /* UTF-8, owned by the str it was read from */
    Py_ssize_t len;
} Text;

typedef struct {
    Text id;
    double scores[3]; /* Jaccard, containment, contains */
} CandidateOut;

enum { KIND_UNIQUE, KIND_DUPLICATE, KIND_PARTIAL, KIND_REVISED, KINDS };
static const char *const kind_names[KINDS] = {"unique", "duplicate", "partial", "revised"};

typedef struct {
    int kind, exact, has_match;
    Text match, canonical;
    double scores[3];      /* the match's, when has_match */
    PyObject *raw[3];      /* the same as given (a float, or None where there is no match) */
    CandidateOut *candidates;
    Py_ssize_t candidate_count;
    int64_t (*passages)[5]; /* start, end, other start, other end, anchors */
    Py_ssize_t passage_count;
} DecisionOut;

typedef struct {
    Text id, cluster_id;
    int64_t seq, version, time_ms, cluster, shingle_count;
    int short_text;
    Py_buffer hash, verifier, signature, anchors; /* anchors: empty for a duplicate */
    PyObject *keys;                               /* the band keys, a tuple of bytes */
    DecisionOut decision;
    PyObject *held[32]; /* the objects the fields above point into, released by article_release */
    int held_count;
} ArticleOut;

static PyObject *name_article_id, *name_version, *name_seq, *name_time_ms, *name_cluster, *name_cluster_id,
    *name_keys, *name_sketch, *name_decision, *name_content_hash, *name_verifier, *name_signature,
    *name_shingle_count, *name_short, *name_anchors, *name_packed, *name_kind, *name_match_id, *name_jaccard,
    *name_containment, *name_contains, *name_canonical_id, *name_exact, *name_candidates, *name_passages,
    *name_start, *name_end, *name_other_start, *name_other_end, *name_anchor_count, *name_record, *empty_bytes;

/* An attribute of `owner`, kept until the article is released (NULL: an error is set). */
static PyObject *held_attr(ArticleOut *a, PyObject *owner, PyObject *name) {
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value != NULL) {
        if (a->held_count == (int)(sizeof a->held / sizeof a->held[0])) {
            Py_DECREF(value);
            PyErr_SetString(PyExc_RuntimeError, "_decide: too many attributes held");
            return NULL;
        }
        a->held[a->held_count++] = value;
    }
    return value;
}

static int text_of(PyObject *value, Text *out) {
    if (!PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "expected a str, got %.80s", Py_TYPE(value)->tp_name);
        return -1;
    }
    out->text = PyUnicode_AsUTF8AndSize(value, &out->len);
    return out->text == NULL ? -1 : 0;
}

static int int_attr(ArticleOut *a, PyObject *owner, PyObject *name, int64_t *out) {
    PyObject *value = held_attr(a, owner, name);
    if (value == NULL) {
        return -1;
    }
    long long number = PyLong_AsLongLong(value);
    if (number == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)number;
    return 0;
}

static int text_attr(ArticleOut *a, PyObject *owner, PyObject *name, Text *out) {
    PyObject *value = held_attr(a, owner, name);
    return value == NULL ? -1 : text_of(value, out);
}

static int buffer_attr(ArticleOut *a, PyObject *owner, PyObject *name, Py_buffer *out, int flags) {
    PyObject *value = held_attr(a, owner, name);
    return value == NULL ? -1 : PyObject_GetBuffer(value, out, flags);
}

static int scores_of(PyObject *owner, PyObject **raw, double *scores, int keep_raw) {
    PyObject *names[3] = {name_jaccard, name_containment, name_contains};
    for (int i = 0; i < 3; i++) {
        PyObject *value = PyObject_GetAttr(owner, names[i]);
        if (value == NULL) {
            return -1;
        }
        scores[i] = value == Py_None ? 0.0 : PyFloat_AsDouble(value);
        if (keep_raw) {
            raw[i] = value; /* released with the article */
        } else {
            Py_DECREF(value);
        }
        if (scores[i] == -1.0 && PyErr_Occurred()) {
            return -1;
        }
    }
    return 0;
}

static void article_release(ArticleOut *a) {
    Py_buffer *buffers[4] = {&a->hash, &a->verifier, &a->signature, &a->anchors};
    for (int i = 0; i < 4; i++) {
        if (buffers[i]->obj != NULL) {
            PyBuffer_Release(buffers[i]);
        }
    }
    for (int i = 0; i < 3; i++) {
        Py_CLEAR(a->decision.raw[i]);
    }
    PyMem_Free(a->decision.candidates);
    PyMem_Free(a->decision.passages);
    while (a->held_count) {
        Py_DECREF(a->held[--a->held_count]);
    }
}

static int decision_read(ArticleOut *a, PyObject *decision) {
    DecisionOut *d = &a->decision;
    PyObject *kind = held_attr(a, decision, name_kind);
    if (kind == NULL) {
        return -1;
    }
    d->kind = -1;
    for (int i = 0; i < KINDS && PyUnicode_Check(kind); i++) {
        if (PyUnicode_CompareWithASCIIString(kind, kind_names[i]) == 0) {
            d->kind = i;
        }
    }
    if (d->kind < 0) {
        PyErr_SetString(PyExc_ValueError, "a decision's kind must be unique, duplicate, partial or revised");
        return -1;
    }
    PyObject *exact = held_attr(a, decision, name_exact), *match = held_attr(a, decision, name_match_id);
    if (exact == NULL || match == NULL || (d->exact = PyObject_IsTrue(exact)) < 0) {
        return -1;
    }
    d->has_match = match != Py_None;
    if ((d->has_match && text_of(match, &d->match) < 0) || text_attr(a, decision, name_canonical_id, &d->canonical) < 0 ||
        scores_of(decision, d->raw, d->scores, 1) < 0) {
        return -1;
    }
    PyObject *candidates = held_attr(a, decision, name_candidates);
    if (candidates == NULL || !PyTuple_Check(candidates)) {
        return candidates == NULL ? -1 : invalid("a decision's candidates must be a tuple");
    }
    d->candidate_count = PyTuple_GET_SIZE(candidates);
    d->candidates = PyMem_Calloc((size_t)d->candidate_count + 1, sizeof(CandidateOut));
    if (d->candidates == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < d->candidate_count; i++) {
        PyObject *candidate = PyTuple_GET_ITEM(candidates, i);
        /* the candidate's id stays alive with the tuple, which the article holds */
        PyObject *id = PyObject_GetAttr(candidate, name_article_id);
        if (id == NULL) {
            return -1;
        }
        int failed = text_of(id, &d->candidates[i].id);
        Py_DECREF(id);
        if (failed || scores_of(candidate, NULL, d->candidates[i].scores, 0) < 0) {
            return -1;
        }
    }
    PyObject *passages = held_attr(a, decision, name_passages);
    if (passages == NULL || !PyTuple_Check(passages)) {
        return passages == NULL ? -1 : invalid("a decision's passages must be a tuple");
    }
    d->passage_count = PyTuple_GET_SIZE(passages);
    d->passages = PyMem_Calloc((size_t)d->passage_count + 1, sizeof *d->passages);
    if (d->passages == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *fields[5] = {name_start, name_end, name_other_start, name_other_end, name_anchors};
    for (Py_ssize_t i = 0; i < d->passage_count; i++) {
        for (int f = 0; f < 5; f++) {
            PyObject *value = PyObject_GetAttr(PyTuple_GET_ITEM(passages, i), fields[f]);
            if (value == NULL) {
                return -1;
            }
            d->passages[i][f] = (int64_t)PyLong_AsLongLong(value);
            Py_DECREF(value);
            if (d->passages[i][f] == -1 && PyErr_Occurred()) {
                return -1;
            }
        }
    }
    return 0;
}

/* What the record needs of `article` (the verdict reads only its id, version and decision: `whole`
 * 0). */
static int article_read(ArticleOut *a, PyObject *article, int whole) {
    memset(a, 0, sizeof *a);
    PyObject *decision = held_attr(a, article, name_decision);
    if (decision == NULL || text_attr(a, article, name_article_id, &a->id) < 0 ||
        int_attr(a, article, name_version, &a->version) < 0 || decision_read(a, decision) < 0) {
        return -1;
    }
    if (!whole) {
        return 0;
    }
    PyObject *sketch = held_attr(a, article, name_sketch);
    if (sketch == NULL || int_attr(a, article, name_seq, &a->seq) < 0 || int_attr(a, article, name_time_ms, &a->time_ms) < 0 ||
        int_attr(a, article, name_cluster, &a->cluster) < 0 ||
        text_attr(a, article, name_cluster_id, &a->cluster_id) < 0 ||
        int_attr(a, sketch, name_shingle_count, &a->shingle_count) < 0 ||
        buffer_attr(a, sketch, name_content_hash, &a->hash, PyBUF_SIMPLE) < 0 ||
        buffer_attr(a, sketch, name_verifier, &a->verifier, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    if (a->verifier.itemsize != 1) {
        return invalid("a verifier must have one byte a slot");
    }
    PyObject *short_text = held_attr(a, sketch, name_short);
    if (short_text == NULL || (a->short_text = PyObject_IsTrue(short_text)) < 0) {
        return -1;
    }
    if (a->verifier.len == 0) { /* no verifier: the record keeps the signature */
        if (buffer_attr(a, sketch, name_signature, &a->signature, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            return -1;
        }
        const char *format = a->signature.format ? a->signature.format : "B";
        if (a->signature.itemsize != 8 || format[0] == '>' || format[0] == '!') {
            return invalid("a signature must be 8-byte integers in the machine's order");
        }
    }
    if (a->decision.kind != KIND_DUPLICATE) { /* a duplicate keeps no anchors */
        PyObject *anchors = held_attr(a, sketch, name_anchors);
        if (anchors == NULL || buffer_attr(a, anchors, name_packed, &a->anchors, PyBUF_SIMPLE) < 0) {
            return -1;
        }
    }
    a->keys = held_attr(a, article, name_keys);
    if (a->keys == NULL) {
        return -1;
    }
    if (!PyTuple_Check(a->keys)) {
        return invalid("an article's band keys must be a tuple of bytes");
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(a->keys); i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(a->keys, i))) {
            return invalid("an article's band keys must be a tuple of bytes");
        }
    }
    return 0;
}

/* -- the record --------------------------------------------------------------------------------- */

#define MAGIC "N7"
#define BAND_INDEX 2   /* a band key's index bytes, which its position gives back */
#define DIGEST_BYTES 8 /* a band key's digest: the key without its index */
#define BAND_KEY_BYTES (BAND_INDEX + DIGEST_BYTES)
#define ANCHOR_BYTES 5
#define HEAD_FIELDS 13 /* the head's varints */
enum { FLAG_SHORT = 1, FLAG_OWN_CLUSTER = 2 };
enum { EXACT = 1, CANONICAL_SELF = 2, CANONICAL_CLUSTER = 4, MATCH_APART = 8 };
#define NO_PLACE 255

static int same_text(Text a, Text b) { return a.len == b.len && memcmp(a.text, b.text, (size_t)a.len) == 0; }

static int put_id(Buf *b, Text id) { return put_varint(b, (uint64_t)id.len) < 0 ? -1 : put(b, id.text, id.len); }

static int put_scores(Buf *b, const double *scores) {
    for (int i = 0; i < 3; i++) {
        if (put_be_double(b, scores[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

static int unsigned_varint(Buf *b, int64_t value) {
    if (value < 0) {
        return invalid("a record's numbers must be >= 0");
    }
    return put_varint(b, (uint64_t)value);
}

static uint64_t zigzag(int64_t value) {
    return value >= 0 ? (uint64_t)value * 2 : (uint64_t)(-(value + 1)) * 2 + 1;
}

/* The decision's bytes (records.py: _compact_decision). */
static int decision_write(Buf *b, const ArticleOut *a) {
    const DecisionOut *d = &a->decision;
    Py_ssize_t where = NO_PLACE;
    int scored = d->raw[0] != Py_None && d->raw[1] != Py_None && d->raw[2] != Py_None;
    for (Py_ssize_t i = 0; d->has_match && scored && i < d->candidate_count && where == NO_PLACE; i++) {
        const CandidateOut *c = &d->candidates[i];
        if (same_text(c->id, d->match) && c->scores[0] == d->scores[0] && c->scores[1] == d->scores[1] &&
            c->scores[2] == d->scores[2]) {
            where = i;
        }
    }
    if (where == NO_PLACE && d->has_match && !scored) {
        PyErr_SetString(PyExc_TypeError, "a decision with a match needs its three scores");
        return -1;
    }
    if (d->candidate_count > 255) {
        return invalid("a record keeps at most 255 candidates");
    }
    int flags = d->exact ? EXACT : 0;
    Text cluster_id = a->cluster_id;
    if (same_text(d->canonical, a->id)) {
        flags |= CANONICAL_SELF;
    } else if (same_text(d->canonical, cluster_id)) {
        flags |= CANONICAL_CLUSTER;
    }
    if (d->has_match && where == NO_PLACE) {
        flags |= MATCH_APART;
    }
    unsigned char head[4] = {(unsigned char)d->kind, (unsigned char)flags, (unsigned char)where,
                             (unsigned char)d->candidate_count};
    if (put(b, head, 4) < 0 || ((flags & MATCH_APART) && (put_id(b, d->match) < 0 || put_scores(b, d->scores) < 0)) ||
        (!(flags & (CANONICAL_SELF | CANONICAL_CLUSTER)) && put_id(b, d->canonical) < 0)) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < d->candidate_count; i++) {
        if (put_id(b, d->candidates[i].id) < 0 || put_scores(b, d->candidates[i].scores) < 0) {
            return -1;
        }
    }
    if (d->passage_count && put_varint(b, (uint64_t)d->passage_count) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < d->passage_count; i++) {
        for (int f = 0; f < 5; f++) {
            if (unsigned_varint(b, d->passages[i][f]) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

static int record_write(Buf *b, const ArticleOut *a) {
    Buf decision = {0};
    if (decision_write(&decision, a) < 0) {
        PyMem_Free(decision.data);
        return -1;
    }
    int own = same_text(a->cluster_id, a->id);
    Py_ssize_t key_bytes = 0, key_count = PyTuple_GET_SIZE(a->keys);
    for (Py_ssize_t i = 0; i < key_count; i++) {
        Py_ssize_t size = PyBytes_GET_SIZE(PyTuple_GET_ITEM(a->keys, i));
        key_bytes += size > BAND_INDEX ? size - BAND_INDEX : 0;
    }
    int64_t from_cluster;
    int failed = __builtin_sub_overflow(a->seq, a->cluster, &from_cluster);
    if (failed) {
        PyErr_SetString(PyExc_OverflowError, "an article's seq and cluster are too far apart");
    }
    int64_t unsigned_fields[3] = {a->seq, a->version, a->shingle_count};
    for (int i = 0; i < 3 && !failed; i++) {
        failed = unsigned_fields[i] < 0 && invalid("a record's numbers must be >= 0");
    }
    uint64_t head[HEAD_FIELDS] = {(uint64_t)a->seq,
                       (uint64_t)a->version,
                       zigzag(a->time_ms),
                       zigzag(from_cluster),
                       (uint64_t)a->shingle_count,
                       (uint64_t)((a->short_text ? FLAG_SHORT : 0) | (own ? FLAG_OWN_CLUSTER : 0)),
                       (uint64_t)a->id.len,
                       (uint64_t)(own ? 0 : a->cluster_id.len),
                       (uint64_t)a->hash.len,
                       (uint64_t)a->verifier.len,
                       (uint64_t)key_bytes,
                       (uint64_t)decision.len,
                       (uint64_t)(a->anchors.len / ANCHOR_BYTES)};
    failed = failed || PUT_TEXT(b, MAGIC) < 0;
    for (size_t i = 0; i < HEAD_FIELDS && !failed; i++) {
        failed = put_varint(b, head[i]) < 0;
    }
    failed = failed || put(b, a->id.text, a->id.len) < 0 || (!own && put(b, a->cluster_id.text, a->cluster_id.len) < 0) ||
             put(b, a->verifier.buf, a->verifier.len) < 0;
    for (Py_ssize_t i = 0; i < key_count && !failed; i++) {
        PyObject *key = PyTuple_GET_ITEM(a->keys, i);
        if (PyBytes_GET_SIZE(key) > BAND_INDEX) {
            failed = put(b, PyBytes_AS_STRING(key) + BAND_INDEX, PyBytes_GET_SIZE(key) - BAND_INDEX) < 0;
        }
    }
    failed = failed || put(b, a->hash.buf, a->hash.len) < 0 || put(b, decision.data, decision.len) < 0 ||
             put(b, a->anchors.buf, a->anchors.len) < 0;
    PyMem_Free(decision.data);
    Py_ssize_t slots = a->signature.obj != NULL ? a->signature.len / 8 : 0;
    for (Py_ssize_t i = 0; i < slots && !failed; i++) { /* little-endian, whatever the machine's order */
        uint64_t value;
        memcpy(&value, (const char *)a->signature.buf + i * 8, 8);
        unsigned char out[8];
        for (int k = 0; k < 8; k++, value >>= 8) {
            out[k] = (unsigned char)(value & 0xFF);
        }
        failed = put(b, out, 8) < 0;
    }
    return failed ? -1 : 0;
}

static PyObject *encode_record(PyObject *self, PyObject *article) {
    (void)self;
    ArticleOut a;
    Buf out = {0};
    PyObject *result = NULL;
    if (article_read(&a, article, 1) == 0 && record_write(&out, &a) == 0) {
        result = finished(&out);
        out.data = NULL;
    }
    PyMem_Free(out.data);
    article_release(&a);
    return result;
}

/* -- the verdict's JSON ---------------------------------------------------------------------- */

static int json_text(Buf *b, Text text) {
    static const char hex[] = "0123456789abcdef";
    if (grow(b, text.len * 6 + 2) < 0) {
        return -1;
    }
    char *out = b->data + b->len;
    *out++ = '"';
    for (Py_ssize_t i = 0; i < text.len; i++) {
        unsigned char c = (unsigned char)text.text[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *out++ = (char)c;
            continue;
        }
        *out++ = '\\';
        switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\f': *out++ = 'f'; break;
        case '\n': *out++ = 'n'; break;
        case '\r': *out++ = 'r'; break;
        case '\t': *out++ = 't'; break;
        default:
            memcpy(out, "u00", 3);
            out[3] = hex[c >> 4];
            out[4] = hex[c & 0xF];
            out += 5;
        }
    }
    *out++ = '"';
    b->len = out - b->data;
    return 0;
}

/* A float as orjson writes it: Python's shortest round-trip digits (repr), laid out in decimal
 * for exponents from -5 to 15 (repr goes to scientific one place sooner, at -5), the exponent
 * without leading zeros; NaN and the infinities as null. */
static int json_float(Buf *b, double value) {
    if (!isfinite(value)) {
        return PUT_TEXT(b, "null");
    }
    char *text = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL) {
        return -1;
    }
    int failed;
    char *e = strchr(text, 'e');
    if (e == NULL) {
        failed = put(b, text, (Py_ssize_t)strlen(text));
    } else if (strcmp(e, "e-05") == 0) { /* d[.ddd]e-05 -> 0.0000dddd */
        char *digits = text;
        failed = (*digits == '-' && put(b, digits++, 1) < 0) || PUT_TEXT(b, "0.0000") < 0;
        for (; digits < e && !failed; digits++) {
            failed = *digits != '.' && put(b, digits, 1) < 0;
        }
    } else {
        const char *exponent = e + 2; /* past e+ or e- */
        while (*exponent == '0' && exponent[1] != '\0') {
            exponent++;
        }
        failed = put(b, text, e - text + 2) < 0 || put(b, exponent, (Py_ssize_t)strlen(exponent)) < 0;
    }
    PyMem_Free(text);
    return failed ? -1 : 0;
}

static int json_int(Buf *b, int64_t value) {
    char text[24];
    int n = snprintf(text, sizeof text, "%lld", (long long)value);
    return put(b, text, n);
}

/* A score as the verdict gives it: a float, or null (a verdict without a match). */
static int json_score(Buf *b, PyObject *raw, double value) {
    return raw == Py_None ? PUT_TEXT(b, "null") : json_float(b, value);
}

static int verdict_write(Buf *b, const ArticleOut *a, const char *params, Py_ssize_t params_len, PyObject *latency) {
    const DecisionOut *d = &a->decision;
    static const char *const score_keys[3] = {",\"jaccard\":", ",\"containment\":", ",\"contains\":"};
    if (PUT_TEXT(b, "{\"article_id\":") < 0 || json_text(b, a->id) < 0 || PUT_TEXT(b, ",\"verdict\":\"") < 0 ||
        put(b, kind_names[d->kind], (Py_ssize_t)strlen(kind_names[d->kind])) < 0 || PUT_TEXT(b, "\",\"match_id\":") < 0 ||
        (d->has_match ? json_text(b, d->match) : PUT_TEXT(b, "null")) < 0) {
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        if (put(b, score_keys[i], (Py_ssize_t)strlen(score_keys[i])) < 0 || json_score(b, d->raw[i], d->scores[i]) < 0) {
            return -1;
        }
    }
    if (PUT_TEXT(b, ",\"canonical_id\":") < 0 || json_text(b, d->canonical) < 0 || PUT_TEXT(b, ",\"exact\":") < 0 ||
        (d->exact ? PUT_TEXT(b, "true") : PUT_TEXT(b, "false")) < 0 || PUT_TEXT(b, ",\"version\":") < 0 ||
        json_int(b, a->version) < 0 || PUT_TEXT(b, ",\"candidates\":[") < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < d->candidate_count; i++) {
        const CandidateOut *c = &d->candidates[i];
        if ((i && PUT_TEXT(b, ",") < 0) || PUT_TEXT(b, "{\"article_id\":") < 0 || json_text(b, c->id) < 0) {
            return -1;
        }
        for (int s = 0; s < 3; s++) {
            if (put(b, score_keys[s], (Py_ssize_t)strlen(score_keys[s])) < 0 || json_float(b, c->scores[s]) < 0) {
                return -1;
            }
        }
        if (PUT_TEXT(b, "}") < 0) {
            return -1;
        }
    }
    if (PUT_TEXT(b, "],\"params\":") < 0 || put(b, params, params_len) < 0) {
        return -1;
    }
    static const char *const span_keys[5] = {"{\"start\":", ",\"end\":", ",\"match_start\":", ",\"match_end\":",
                                             ",\"anchors\":"};
    if (d->passage_count && PUT_TEXT(b, ",\"passages\":{\"offsets\":\"canonical\",\"spans\":[") < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < d->passage_count; i++) {
        if (i && PUT_TEXT(b, ",") < 0) {
            return -1;
        }
        for (int f = 0; f < 5; f++) {
            if (put(b, span_keys[f], (Py_ssize_t)strlen(span_keys[f])) < 0 || json_int(b, d->passages[i][f]) < 0) {
                return -1;
            }
        }
        if (PUT_TEXT(b, "}") < 0) {
            return -1;
        }
    }
    if ((d->passage_count && PUT_TEXT(b, "]}") < 0) || PUT_TEXT(b, ",\"latency_ms\":") < 0) {
        return -1;
    }
    if (latency == Py_None) {
        return PUT_TEXT(b, "null}");
    }
    double value = PyFloat_AsDouble(latency);
    if (value == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    return json_float(b, value) < 0 ? -1 : PUT_TEXT(b, "}");
}

static PyObject *verdict_json(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *article, *latency;
    const char *params;
    Py_ssize_t params_len;
    if (!PyArg_ParseTuple(args, "Oy#O", &article, &params, &params_len, &latency)) {
        return NULL;
    }
    if (latency != Py_None && !PyFloat_Check(latency)) {
        PyErr_SetString(PyExc_TypeError, "latency_ms must be a float or None");
        return NULL;
    }
    ArticleOut a;
    Buf out = {0};
    PyObject *result = NULL;
    if (article_read(&a, article, 0) == 0 && verdict_write(&out, &a, params, params_len, latency) == 0) {
        result = finished(&out);
        out.data = NULL;
    }
    PyMem_Free(out.data);
    article_release(&a);
    return result;
}

/* -- the decision of fresh articles -------------------------------------------------------------
 *
 * decide_fresh(items, seq, context) -> (results, done, counts)
 *     A run of articles decided and indexed in order, each seeing the ones before it, as
 *     tests/support/reference_decide.py's decide and state/index.py's apply do one article at a
 *     time (the reference the tests compare with): new ids, exact copies, articles whose content
 *     an expired holder held, new versions of an id and revived ones. The run stops before a
 *     re-delivery of the version held (the caller answers it with its stored verdict), and before
 *     one whose reads or scoring raise (a record that does not decode, a verifier of another
 *     length) but the first, whose error the call raises: the caller offers it again alone, in a
 *     run of its own, which decides it or raises. The run's reads go through the callables of
 *     `context` after the writes it made (`main`), most of them in one call for the whole run
 *     before its first decision (read_ahead), each key and record read once; its own articles'
 *     records are made into probes (`probe_of`) only when proposed. Its writes go into `main` and
 *     `records`, the caller writing them in one batch, a replaced version's removal and a revived
 *     id's marker among them (`scanned` lists the copy and member keys the run added, which
 *     `first_key` finds where a removal scans for the next holder of a content or head of a
 *     cluster).
 *
 *     items: tuples (article_id, content_hash, band keys (a tuple of bytes), verifier (uint8
 *     buffer), signature (uint64 buffer: scored, and kept in the record, where the verifier is
 *     empty), shingle_count, short, anchors (packed), time_ms, cutoff_ms or None, latency_ms or
 *     None). seq: the first article's arrival number. context: (get_many, read_postings,
 *     prospects, probe_of, first_key, corrupt, main, records, times_written, postings_written,
 *     scanned, bucket_sizes, before or None, before_base, audit, settings); probe_of(record): its
 *     probe (state/records.py: decode_probe); first_key(prefix, skip): the first key under
 *     `prefix` as the run leaves them, but the one ending in the seq `skip` (state/tables.py:
 *     first_key), None for none; corrupt: the exception a stored record or marker that does not
 *     decode raises (CorruptRecord); settings: (bucket bytes,
 *     posting bytes, max_candidates, top_candidates, anchor_candidates, passages, threshold,
 *     containment or -1, revised or -1, anchor lookup, empty slot, chance, anchor k, gap, shift,
 *     repeats).
 *     results: (record, verdict, kind, revived) of each article decided; done: how many; counts:
 *     (buckets, postings, boilerplate, clusters, articles added, newest_ms or None, next seq). */

#define POSTING_ENTRY 5
#define POSTING_SEQS ((((int64_t)1) << 39) - 1)
#define FEW_ANCHORS (((int64_t)1) << 39)
#define TIME_BIAS (((uint64_t)1) << 63)

typedef struct {
    PyObject *get_many, *read_postings, *prospects, *probe_of, *first_key, *corrupt, *main, *records,
        *times_written, *postings_written, *scanned, *sizes, *before, *audit;
    /* what the run read, each key or seq once: the store does not change under a run, and its own
     * writes are in `main`; its articles' records by seq, their probes made only when proposed */
    PyObject *read, *probes, *own_records;
    Py_ssize_t before_base, bucket_bytes, posting_bytes, max_candidates, top_candidates, anchor_candidates,
        passage_limit, k, gap, shift, repeats;
    double threshold, containment, revised, chance;
    int anchor_lookup, empty_slot;
} Engine;

typedef struct {
    long long buckets, postings, boilerplate, clusters, articles;
    int has_newest;
    int64_t newest, seq;
} Added;

/* What a replaced version's removal reads of its stored record (state/records.py's layout),
 * pointing into the record. */
typedef struct {
    int64_t seq, version, time_ms, cluster;
    int in_postings; /* not a duplicate (IndexedArticle.in_postings) */
    const char *hash, *digests, *anchors;
    Py_ssize_t hash_len, digests_len, anchors_len;
} Stored;

/* One article of the run: its fields as given, then what its decision read and chose. */
typedef struct {
    PyObject *id, *hash, *keys, *verifier, *signature, *anchors, *latency, *keep; /* keep: every object read */
    PyObject *slots;   /* what scoring compares: the verifier, or without one the signature (little-endian) */
    Py_ssize_t width;  /* bytes a slot of `slots` */
    double chance;     /* chance agreements of a slot (a signature's: none) */
    int64_t shingle_count, time_ms, cutoff;
    int short_text, has_cutoff, exact;
    PyObject *bucket_names, *buckets, *posting_names, *postings; /* NULL: not read */
    int kind;
    PyObject *match;         /* the probe matched, NULL for unique */
    PyObject *match_scores;  /* (jaccard, containment, contains) */
    PyObject *kept;          /* list of (probe id, jaccard, containment, contains) */
    PyObject *shared;        /* the passages: a list of 5-tuples */
    PyObject *canonical;     /* str */
    int64_t cluster;
    PyObject *cluster_id;    /* str */
    int64_t version;         /* the id's next version: 0 for an id never held */
    int replaces, revived;   /* the id had a version (or a deletion marker: revived) the run replaces */
    PyObject *replaced;      /* the record of the version it replaces, or the revived id's marker */
    Stored old;              /* the version it replaces, read from its record */
    PyObject *holder;        /* a content held by an article it is not a copy of: the holder's seq */
} Fresh;


/* `obj` kept alive until the article is done; returns it (borrowed), NULL passed through. */
static PyObject *kept(Fresh *f, PyObject *obj) {
    if (obj == NULL) {
        return NULL;
    }
    int failed = PyList_Append(f->keep, obj);
    Py_DECREF(obj);
    return failed < 0 ? NULL : obj;
}

uint64_t get_be(const char *data, int width) {
    uint64_t value = 0;
    for (int i = 0; i < width; i++) {
        value = value << 8 | (unsigned char)data[i];
    }
    return value;
}

/* A seq from its 8 big-endian bytes. */
static uint64_t seq_of(const char *data) {
    return get_be(data, 8);
}

/* `value` in `width` big-endian bytes at `out`. */
static void put_be(unsigned char *out, int width, uint64_t value) {
    for (int i = width - 1; i >= 0; i--, value >>= 8) {
        out[i] = (unsigned char)(value & 0xFF);
    }
}

static PyObject *seq_bytes(int64_t seq) {
    unsigned char out[8];
    put_be(out, 8, (uint64_t)seq);
    return PyBytes_FromStringAndSize((const char *)out, 8);
}

static PyObject *prefixed(char prefix, const char *data, Py_ssize_t len) {
    PyObject *key = PyBytes_FromStringAndSize(NULL, len + 1);
    if (key != NULL) {
        PyBytes_AS_STRING(key)[0] = prefix;
        memcpy(PyBytes_AS_STRING(key) + 1, data, (size_t)len);
    }
    return key;
}

static PyObject *prefixed_text(char prefix, PyObject *text) {
    Py_ssize_t len;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &len);
    return utf8 == NULL ? NULL : prefixed(prefix, utf8, len);
}

/* The empty places of `values` filled in order with what `reader` returns for `missing` (their
 * keys), in one call, each kept in `memo` for the rest of the run. */
static int filled(PyObject *values, PyObject *missing, PyObject *reader, PyObject *memo, const char *refusal) {
    if (!PyList_GET_SIZE(missing)) {
        return 0;
    }
    PyObject *read = PyObject_CallOneArg(reader, missing);
    if (read == NULL || !PyList_Check(read) || PyList_GET_SIZE(read) != PyList_GET_SIZE(missing)) {
        if (read != NULL) {
            PyErr_SetString(PyExc_TypeError, refusal);
            Py_DECREF(read);
        }
        return -1;
    }
    int failed = 0;
    for (Py_ssize_t i = 0, next = 0; !failed && i < PyList_GET_SIZE(values); i++) {
        if (PyList_GET_ITEM(values, i) == NULL) {
            PyObject *value = PyList_GET_ITEM(read, next), *key = PyList_GET_ITEM(missing, next++);
            PyList_SET_ITEM(values, i, Py_NewRef(value));
            failed = PyDict_SetItem(memo, key, value) < 0;
        }
    }
    Py_DECREF(read);
    return failed ? -1 : 0;
}

/* The values of `names` as the run's writes leave them, then as the run read them: the others
 * read by `reader` in one call (state/tables.py: as_left), and kept for the rest of the run. */
static PyObject *left(Engine *e, PyObject *names, PyObject *reader) {
    Py_ssize_t count = PyList_GET_SIZE(names);
    PyObject *values = PyList_New(count), *missing = PyList_New(0);
    if (values == NULL || missing == NULL) {
        goto failed;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyList_GET_ITEM(names, i), *known = PyDict_GetItemWithError(e->main, name);
        if (known == NULL && !PyErr_Occurred()) {
            known = PyDict_GetItemWithError(e->read, name);
        }
        if (known == NULL && (PyErr_Occurred() || PyList_Append(missing, name) < 0)) {
            goto failed;
        }
        if (known != NULL) {
            PyList_SET_ITEM(values, i, Py_NewRef(known));
        }
    }
    if (filled(values, missing, reader, e->read, "a reader must return a list of one value a key") < 0) {
        goto failed;
    }
    Py_DECREF(missing);
    return values;
failed:
    Py_XDECREF(values);
    Py_XDECREF(missing);
    return NULL;
}

/* The probes of `seqs` (None: the record is gone), a new list: the run's own articles' from their
 * records, made when first proposed; the others by `prospects` in one call. Each is kept for the
 * rest of the run. */
static PyObject *probes_of(Engine *e, PyObject *seqs) {
    Py_ssize_t count = PyList_GET_SIZE(seqs);
    PyObject *probes = PyList_New(count), *missing = PyList_New(0);
    if (probes == NULL || missing == NULL) {
        goto failed;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *seq = PyList_GET_ITEM(seqs, i), *probe = PyDict_GetItemWithError(e->probes, seq), *record;
        if (probe == NULL && !PyErr_Occurred() && (record = PyDict_GetItemWithError(e->own_records, seq)) != NULL) {
            probe = PyObject_CallOneArg(e->probe_of, record);
            int failed = probe == NULL || PyDict_SetItem(e->probes, seq, probe) < 0;
            Py_XDECREF(probe); /* the dict holds it */
            if (failed) {
                goto failed;
            }
        }
        if (probe == NULL && (PyErr_Occurred() || PyList_Append(missing, seq) < 0)) {
            goto failed;
        }
        if (probe != NULL) {
            PyList_SET_ITEM(probes, i, Py_NewRef(probe));
        }
    }
    if (filled(probes, missing, e->prospects, e->probes, "a prospects reader must return one probe a seq") < 0) {
        goto failed;
    }
    Py_DECREF(missing);
    return probes;
failed:
    Py_XDECREF(probes);
    Py_XDECREF(missing);
    return NULL;
}

/* The probe of arrival `seq` (None: its record is gone), a new reference. */
static PyObject *probe_one(Engine *e, int64_t seq) {
    PyObject *seqs = Py_BuildValue("[L]", (long long)seq);
    PyObject *probes = seqs ? probes_of(e, seqs) : NULL;
    Py_XDECREF(seqs);
    PyObject *probe = probes ? Py_NewRef(PyList_GET_ITEM(probes, 0)) : NULL;
    Py_XDECREF(probes);
    return probe;
}

static int int_of(PyObject *obj, PyObject *name, int64_t *out) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        return -1;
    }
    long long number = PyLong_AsLongLong(value);
    Py_DECREF(value);
    *out = (int64_t)number;
    return number == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Whether probe `p` is another article than `f`'s: a probe of its own id is never its candidate. */
static int other_article(Fresh *f, PyObject *p) {
    PyObject *id = PyObject_GetAttr(p, name_article_id);
    if (id == NULL) {
        return -1;
    }
    int same = PyUnicode_Compare(id, f->id);
    Py_DECREF(id);
    return same == -1 && PyErr_Occurred() ? -1 : same != 0;
}

/* Not before the cutoff (retention): a candidate still held, but expired, is never a match. */
static int in_time(Fresh *f, PyObject *p) {
    int64_t time_ms;
    if (!f->has_cutoff) {
        return 1;
    }
    return int_of(p, name_time_ms, &time_ms) < 0 ? -1 : time_ms >= f->cutoff;
}

/* What probe `p` (None: its record is gone) is to the article: 0 no candidate (gone, or the
 * article's own id), 1 another article but before the cutoff, 2 a candidate; -1 an error. */
static int candidacy(Fresh *f, PyObject *p) {
    int other = p == Py_None ? 0 : other_article(f, p);
    if (other <= 0) {
        return other;
    }
    int timely = in_time(f, p);
    return timely < 0 ? -1 : 1 + timely;
}

/* `name` (a new reference, NULL: failed) appended to `names`. */
static int name_added(PyObject *names, PyObject *name) {
    int failed = name == NULL || PyList_Append(names, name) < 0;
    Py_XDECREF(name);
    return failed ? -1 : 0;
}

/* The keys an article's decision reads first appended to `names`: its id map entry, its deletion
 * marker, its content's holder. */
static int first_names(PyObject *names, PyObject *id, PyObject *hash) {
    return name_added(names, prefixed_text('a', id)) < 0 || name_added(names, prefixed_text('d', id)) < 0 ||
                   name_added(names, prefixed('c', PyBytes_AS_STRING(hash), PyBytes_GET_SIZE(hash))) < 0
               ? -1
               : 0;
}

/* The bucket keys of band keys `keys` (a tuple of bytes) appended to `names`. */
static int band_names(PyObject *names, PyObject *keys) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            return invalid("an item's band keys must be bytes");
        }
        if (name_added(names, prefixed('b', PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The posting list keys of packed anchors (Postings.names), a new list. */
static PyObject *anchor_names(PyObject *anchors) {
    PyObject *args = Py_BuildValue("(Oy)", anchors, "n");
    PyObject *names = args ? posting_keys(NULL, args) : NULL;
    Py_XDECREF(args);
    return names;
}

/* The article's posting list keys, made once. */
static PyObject *posting_names(Fresh *f) {
    if (f->posting_names == NULL) {
        f->posting_names = kept(f, anchor_names(f->anchors));
    }
    return f->posting_names;
}

/* The band candidates (IndexState.candidates, then the cutoff), a new list. */
static PyObject *band_candidates(Engine *e, Fresh *f) {
    PyObject *names = kept(f, PyList_New(0));
    if (names == NULL || band_names(names, f->keys) < 0) {
        return NULL;
    }
    f->bucket_names = names;
    f->buckets = kept(f, left(e, names, e->get_many));
    PyObject *args = f->buckets ? Py_BuildValue("(On)", f->buckets, e->max_candidates + 1) : NULL;
    PyObject *seqs = args ? kept(f, merge_buckets(NULL, args)) : NULL;
    Py_XDECREF(args);
    PyObject *probes = seqs ? kept(f, probes_of(e, seqs)) : NULL;
    PyObject *others = probes ? PyList_New(0) : NULL;
    Py_ssize_t proposed = 0;
    for (Py_ssize_t i = 0; others != NULL && i < PyList_GET_SIZE(probes) && proposed < e->max_candidates; i++) {
        PyObject *p = PyList_GET_ITEM(probes, i);
        int is = candidacy(f, p);
        proposed += is > 0;
        if (is < 0 || (is == 2 && PyList_Append(others, p) < 0)) {
            Py_CLEAR(others);
        }
    }
    return others;
}

/* The anchor candidates with how many anchors each shares (IndexState.anchor_candidates, then the
 * cutoff): a new list of (probe, count). */
static PyObject *anchor_candidates(Engine *e, Fresh *f, int64_t seq) {
    PyObject *anchored = PyList_New(0);
    if (anchored == NULL || !PyList_GET_SIZE(f->posting_names)) {
        return anchored;
    }
    f->postings = kept(f, left(e, f->posting_names, e->read_postings));
    Py_ssize_t need = PyList_GET_SIZE(f->posting_names) < 2 ? PyList_GET_SIZE(f->posting_names) : 2;
    PyObject *args = f->postings ? Py_BuildValue("(Onnnn)", f->postings, (Py_ssize_t)POSTING_ENTRY, e->posting_bytes,
                                                 need, e->anchor_candidates + 1)
                                 : NULL;
    PyObject *ranked = args ? kept(f, count_postings(NULL, args)) : NULL;
    Py_XDECREF(args);
    PyObject *seqs = ranked ? kept(f, PyList_New(PyList_GET_SIZE(ranked))) : NULL;
    int64_t newest = seq - 1;
    for (Py_ssize_t i = 0; seqs != NULL && i < PyList_GET_SIZE(ranked); i++) {
        long long low = PyLong_AsLongLong(PyTuple_GET_ITEM(PyList_GET_ITEM(ranked, i), 0));
        PyObject *whole = low == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(newest - ((newest - low) & POSTING_SEQS));
        if (whole == NULL) {
            seqs = NULL;
            break;
        }
        PyList_SET_ITEM(seqs, i, whole);
    }
    PyObject *probes = seqs ? kept(f, probes_of(e, seqs)) : NULL;
    if (probes == NULL) {
        Py_DECREF(anchored);
        return NULL;
    }
    Py_ssize_t proposed = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(probes) && proposed < e->anchor_candidates; i++) {
        PyObject *p = PyList_GET_ITEM(probes, i);
        int is = candidacy(f, p);
        proposed += is > 0;
        PyObject *pair = is == 2 ? Py_BuildValue("(OO)", p, PyTuple_GET_ITEM(PyList_GET_ITEM(ranked, i), 1)) : NULL;
        int failed = is < 0 || (is == 2 && (pair == NULL || PyList_Append(anchored, pair) < 0));
        Py_XDECREF(pair);
        if (failed) {
            Py_DECREF(anchored);
            return NULL;
        }
    }
    return anchored;
}

/* reference_decide.py's _holds. */
static int holds(int64_t shared, int64_t total, double threshold) {
    double share = (double)shared / (double)total;
    if ((share < 1.0 ? share : 1.0) >= threshold) {
        return 1;
    }
    return total >= 3 && shared >= total - 1 && (double)(total - 1) / (double)total < threshold;
}

/* reference_decide.py's _contained: the kind (-1: none), with its probe (borrowed) and shares. */
static int contained(Engine *e, Fresh *f, PyObject *anchored, PyObject **other, double *inside, double *contains) {
    /* its distinct anchors: one posting list each */
    int64_t mine = PyList_GET_SIZE(f->posting_names), best_seq = 0, best_shared = 0, best_theirs = 0;
    double best_share = -1.0;
    *other = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(anchored); i++) {
        PyObject *p = PyTuple_GET_ITEM(PyList_GET_ITEM(anchored, i), 0);
        int64_t shared = PyLong_AsLongLong(PyTuple_GET_ITEM(PyList_GET_ITEM(anchored, i), 1)), count, seq;
        if ((shared == -1 && PyErr_Occurred()) || int_of(p, name_anchor_count, &count) < 0 || int_of(p, name_seq, &seq) < 0) {
            return -2;
        }
        int64_t least = mine < count ? mine : count;
        least = least < 2 ? least : 2;
        if (shared < (least > 1 ? least : 1)) {
            continue;
        }
        double a = (double)shared / (double)mine, b = (double)shared / (double)(count > 1 ? count : 1);
        a = a < 1.0 ? a : 1.0;
        b = b < 1.0 ? b : 1.0;
        double share = a > b ? a : b;
        if (*other == NULL || share > best_share || (share == best_share && -seq > -best_seq)) {
            *other = p;
            best_share = share, best_seq = seq, best_shared = shared;
            best_theirs = count > 1 ? count : 1;
            *inside = a, *contains = b;
        }
    }
    if (*other == NULL) {
        return -1;
    }
    if (e->containment >= 0 && (holds(best_shared, mine, e->containment) || holds(best_shared, best_theirs, e->containment))) {
        return KIND_PARTIAL;
    }
    if (e->revised >= 0 && (*inside > *contains ? *inside : *contains) >= e->revised) {
        return KIND_REVISED;
    }
    *other = NULL;
    return -1;
}

/* The verdict naming probe `p` (reference_decide.py's _matched): the passages but for a
 * duplicate, the cluster's head or its first article as canonical, and `p`'s cluster. */
static int matched(Engine *e, Fresh *f, int kind, PyObject *p, PyObject *scores_tuple) {
    f->kind = kind, f->match = p, f->match_scores = scores_tuple;
    f->shared = kept(f, PyList_New(0));
    if (f->shared == NULL) {
        return -1;
    }
    if (kind != KIND_DUPLICATE) {
        PyObject *theirs = kept(f, PyObject_GetAttr(p, name_anchors));
        PyObject *packed = theirs ? kept(f, PyObject_GetAttr(theirs, name_packed)) : NULL;
        PyObject *args = packed ? Py_BuildValue("(OOnnnnn)", f->anchors, packed, e->k, e->gap, e->shift, e->repeats,
                                                e->passage_limit)
                                : NULL;
        f->shared = args ? kept(f, passages(NULL, args)) : NULL;
        Py_XDECREF(args);
        if (f->shared == NULL) {
            return -1;
        }
    }
    f->cluster_id = kept(f, PyObject_GetAttr(p, name_cluster_id));
    if (f->cluster_id == NULL || int_of(p, name_cluster, &f->cluster) < 0) {
        return -1;
    }
    PyObject *cluster = kept(f, seq_bytes(f->cluster));
    PyObject *head_key = cluster ? kept(f, prefixed('h', PyBytes_AS_STRING(cluster), 8)) : NULL;
    PyObject *names = head_key ? kept(f, PyList_New(1)) : NULL;
    if (names == NULL) {
        return -1;
    }
    PyList_SET_ITEM(names, 0, Py_NewRef(head_key));
    PyObject *heads = kept(f, left(e, names, e->get_many));
    if (heads == NULL) {
        return -1;
    }
    PyObject *head = PyList_GET_ITEM(heads, 0);
    if (head == Py_None) {
        f->canonical = f->cluster_id;
        return 0;
    }
    if (!PyBytes_Check(head) || PyBytes_GET_SIZE(head) < 8) {
        PyErr_SetString(PyExc_ValueError, "a cluster's head entry is cut short");
        return -1;
    }
    f->canonical = kept(f, PyUnicode_DecodeUTF8(PyBytes_AS_STRING(head) + 8, PyBytes_GET_SIZE(head) - 8, NULL));
    return f->canonical == NULL ? -1 : 0;
}

static PyObject *candidate_row(PyObject *p, PyObject *jaccard, PyObject *inside, PyObject *contains) {
    PyObject *id = PyObject_GetAttr(p, name_article_id);
    PyObject *row = id ? PyTuple_Pack(4, id, jaccard, inside, contains) : NULL;
    Py_XDECREF(id);
    return row;
}

/* An exact copy of the content's holder, the article of arrival `holder` (reference_decide.py's
 * _exact_match): 1 decided, 2 not a copy (the holder's record gone, or before the cutoff: the
 * article is decided by its bands, and takes the content over), -1 an error. */
static int exact_copy(Engine *e, Fresh *f, PyObject *holder) {
    if (!PyBytes_Check(holder) || PyBytes_GET_SIZE(holder) != 8) {
        return invalid("a content's holder entry must be a seq of 8 bytes");
    }
    PyObject *first = kept(f, probe_one(e, (int64_t)seq_of(PyBytes_AS_STRING(holder))));
    if (first == NULL) {
        return -1;
    }
    int is = candidacy(f, first);
    if (is < 2) {
        return is < 0 ? -1 : 2;
    }
    PyObject *scores_tuple = kept(f, Py_BuildValue("(ddd)", 1.0, 1.0, 1.0));
    PyObject *row = scores_tuple ? kept(f, candidate_row(first, PyTuple_GET_ITEM(scores_tuple, 0),
                                                         PyTuple_GET_ITEM(scores_tuple, 1),
                                                         PyTuple_GET_ITEM(scores_tuple, 2)))
                                 : NULL;
    f->kept = row ? kept(f, PyList_New(0)) : NULL;
    if (f->kept == NULL || PyList_Append(f->kept, row) < 0) {
        return -1;
    }
    f->exact = 1;
    return matched(e, f, KIND_DUPLICATE, first, scores_tuple) < 0 ? -1 : 1;
}

/* -- a replaced version taken out ------------------------------------------------------------ */

static int64_t unzigzag(uint64_t value) { return value & 1 ? -(int64_t)(value >> 1) - 1 : (int64_t)(value >> 1); }

/* A stored record's fields (decode_record reads the same), or `corrupt` raised naming its arrival
 * `seq`. */
static int stored_read(Engine *e, PyObject *record, int64_t seq, Stored *s) {
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(record);
    Py_ssize_t len = PyBytes_GET_SIZE(record), at = 2, parts[6];
    uint64_t head[HEAD_FIELDS] = {0};
    /* the parts in their order: id, cluster id, verifier, band digests, content hash, decision */
    static const int lengths[6] = {6, 7, 9, 10, 8, 11};
    const char *problem = len < 2 || memcmp(data, MAGIC, 2) != 0 ? "unknown record format" : NULL;
    for (int i = 0; problem == NULL && i < HEAD_FIELDS; i++) {
        problem = varint_at(data, len, &at, &head[i]);
    }
    for (int i = 0; problem == NULL && i < 6; i++) {
        if (head[lengths[i]] > (uint64_t)(len - at)) {
            problem = "record is truncated";
        } else {
            parts[i] = at, at += (Py_ssize_t)head[lengths[i]];
        }
    }
    if (problem == NULL && (head[10] % DIGEST_BYTES || head[11] == 0)) {
        problem = "record is truncated";
    }
    if (problem == NULL && head[12] > (uint64_t)(len - at) / ANCHOR_BYTES) {
        problem = "anchors are truncated";
    }
    if (problem != NULL) {
        PyErr_Format(e->corrupt, "state record '%lld' cannot be decoded: %s", (long long)seq, problem);
        return -1;
    }
    s->seq = (int64_t)head[0], s->version = (int64_t)head[1], s->time_ms = unzigzag(head[2]);
    s->cluster = s->seq - unzigzag(head[3]);
    s->digests = (const char *)data + parts[3], s->digests_len = (Py_ssize_t)head[10];
    s->hash = (const char *)data + parts[4], s->hash_len = (Py_ssize_t)head[8];
    s->in_postings = data[parts[5]] != KIND_DUPLICATE;
    s->anchors = (const char *)data + at, s->anchors_len = (Py_ssize_t)head[12] * ANCHOR_BYTES;
    return 0;
}

/* A deletion marker's last version (tables.py: decode_marker), or `corrupt` raised. */
static int marker_read(Engine *e, PyObject *id, PyObject *marker, int64_t *version) {
    if (!PyBytes_Check(marker) || PyBytes_GET_SIZE(marker) != 16) {
        PyErr_Format(e->corrupt, "deletion marker of %R has %zd bytes, not 16", id,
                     PyBytes_Check(marker) ? PyBytes_GET_SIZE(marker) : (Py_ssize_t)-1);
        return -1;
    }
    *version = (int64_t)seq_of(PyBytes_AS_STRING(marker));
    return 0;
}

/* The probe of arrival `seq` (the run's own, or the store's), a new reference; `corrupt` raised
 * where its record is gone. */
static PyObject *probe_at(Engine *e, int64_t seq) {
    PyObject *probe = probe_one(e, seq);
    if (probe == Py_None) {
        Py_DECREF(probe);
        PyErr_Format(e->corrupt, "state record of arrival %lld is missing", (long long)seq);
        return NULL;
    }
    return probe;
}

/* The version an id map entry names, read from its record (kept with the article). */
static int version_read(Engine *e, Fresh *f, PyObject *seq_key) {
    if (!PyBytes_Check(seq_key) || PyBytes_GET_SIZE(seq_key) != 8) {
        PyErr_Format(e->corrupt, "an id map entry is not a seq: %R", seq_key);
        return -1;
    }
    int64_t seq = (int64_t)seq_of(PyBytes_AS_STRING(seq_key));
    PyObject *probe = kept(f, probe_at(e, seq));
    f->replaced = probe ? kept(f, PyObject_GetAttr(probe, name_record)) : NULL;
    if (f->replaced != NULL && !PyBytes_Check(f->replaced)) {
        PyErr_SetString(PyExc_TypeError, "a probe's record must be bytes");
        return -1;
    }
    return f->replaced == NULL ? -1 : stored_read(e, f->replaced, seq, &f->old);
}

/* The decision (reference_decide.py's decide): 1 decided, 0 not one the run takes, -1 an error. */
static int decide_one(Engine *e, Fresh *f, int64_t seq) {
    PyObject *names = kept(f, PyList_New(0));
    if (names == NULL || first_names(names, f->id, f->hash) < 0) {
        return -1;
    }
    PyObject *held = kept(f, left(e, names, e->get_many));
    if (held == NULL) {
        return -1;
    }
    if (PyList_GET_ITEM(held, 0) != Py_None) { /* a new version: the one held is taken out once it is decided */
        if (version_read(e, f, PyList_GET_ITEM(held, 0)) < 0) {
            return -1;
        }
        if (f->old.hash_len == PyBytes_GET_SIZE(f->hash) &&
            memcmp(f->old.hash, PyBytes_AS_STRING(f->hash), (size_t)f->old.hash_len) == 0) {
            return 0; /* the version held has this content: a re-delivery */
        }
        f->version = f->old.version + 1, f->replaces = 1;
    } else if (PyList_GET_ITEM(held, 1) != Py_None) { /* a revived id: its versions go on from its marker's */
        f->replaced = PyList_GET_ITEM(held, 1);
        if (marker_read(e, f->id, f->replaced, &f->version) < 0) {
            return -1;
        }
        f->version++, f->replaces = 1, f->revived = 1;
    }
    if (PyList_GET_ITEM(held, 2) != Py_None) {
        int copy = exact_copy(e, f, PyList_GET_ITEM(held, 2));
        if (copy != 2) {
            return copy;
        }
        f->holder = PyList_GET_ITEM(held, 2);
    }
    PyObject *others = kept(f, band_candidates(e, f));
    f->kept = kept(f, PyList_New(0));
    if (others == NULL || f->kept == NULL) {
        return -1;
    }
    PyObject *match = Py_None;
    if (PyList_GET_SIZE(others)) {
        PyObject *args = Py_BuildValue("(OOLidnddn)", f->slots, others, (long long)f->shingle_count, e->empty_slot,
                                       f->chance, e->top_candidates, e->threshold, e->containment, f->width);
        PyObject *ranked = args ? kept(f, rank(NULL, args)) : NULL;
        Py_XDECREF(args);
        if (ranked == NULL) {
            return -1;
        }
        PyObject *top = PyTuple_GET_ITEM(ranked, 0);
        match = PyTuple_GET_ITEM(ranked, 1);
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(top); i++) {
            PyObject *row = PyList_GET_ITEM(top, i);
            Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(row, 0));
            PyObject *candidate = at < 0 ? NULL
                                         : candidate_row(PyList_GET_ITEM(others, at), PyTuple_GET_ITEM(row, 1),
                                                         PyTuple_GET_ITEM(row, 2), PyTuple_GET_ITEM(row, 3));
            if (candidate == NULL || kept(f, candidate) == NULL || PyList_Append(f->kept, candidate) < 0) {
                return -1;
            }
        }
    }
    PyObject *match_probe = NULL, *match_scores = NULL;
    long match_kind = 0;
    if (match != Py_None) {
        match_kind = PyLong_AsLong(PyTuple_GET_ITEM(match, 0));
        match_probe = PyList_GET_ITEM(others, PyLong_AsSsize_t(PyTuple_GET_ITEM(match, 1)));
        match_scores = kept(f, PyTuple_GetSlice(match, 2, 5));
        if (match_scores == NULL) {
            return -1;
        }
        if (match_kind == 1) { /* a duplicate joins no posting list: no anchor lookup */
            return matched(e, f, KIND_DUPLICATE, match_probe, match_scores) < 0 ? -1 : 1;
        }
    }
    PyObject *anchored = NULL;
    if (PyBytes_GET_SIZE(f->anchors) && e->anchor_lookup) {
        anchored = posting_names(f) ? kept(f, anchor_candidates(e, f, seq)) : NULL;
        if (anchored == NULL) {
            return -1;
        }
    }
    PyObject *other = NULL;
    double inside = 0.0, contains = 0.0;
    int kind = anchored ? contained(e, f, anchored, &other, &inside, &contains) : -1;
    if (kind == -2) {
        return -1;
    }
    if (match_probe != NULL && kind != KIND_PARTIAL) { /* a partial by the verifier: the anchors show where */
        return matched(e, f, KIND_PARTIAL, match_probe, match_scores) < 0 ? -1 : 1;
    }
    if (kind < 0) {
        f->kind = KIND_UNIQUE, f->canonical = f->id, f->cluster = seq, f->cluster_id = f->id;
        f->shared = kept(f, PyList_New(0));
        return f->shared == NULL ? -1 : 1;
    }
    PyObject *one = kept(f, PyList_New(1));
    if (one == NULL) {
        return -1;
    }
    PyList_SET_ITEM(one, 0, Py_NewRef(other));
    PyObject *args = Py_BuildValue("(OOLidn)", f->slots, one, (long long)f->shingle_count, e->empty_slot, f->chance,
                                   f->width);
    PyObject *scored = args ? kept(f, scores(NULL, args)) : NULL;
    Py_XDECREF(args);
    if (scored == NULL) {
        return -1;
    }
    double jaccard;
    memcpy(&jaccard, PyBytes_AS_STRING(PyTuple_GET_ITEM(scored, 0)), sizeof jaccard);
    PyObject *figures = kept(f, Py_BuildValue("(ddd)", jaccard, inside, contains));
    PyObject *other_id = figures ? kept(f, PyObject_GetAttr(other, name_article_id)) : NULL;
    if (other_id == NULL) {
        return -1;
    }
    int listed = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(f->kept) && !listed; i++) {
        int same = PyUnicode_Compare(PyTuple_GET_ITEM(PyList_GET_ITEM(f->kept, i), 0), other_id);
        if (same == -1 && PyErr_Occurred()) {
            return -1;
        }
        listed = same == 0;
    }
    if (!listed) {
        PyObject *row = kept(f, PyTuple_Pack(4, other_id, PyTuple_GET_ITEM(figures, 0), PyTuple_GET_ITEM(figures, 1),
                                             PyTuple_GET_ITEM(figures, 2)));
        if (row == NULL || PyList_Append(f->kept, row) < 0) {
            return -1;
        }
    }
    return matched(e, f, kind, other, figures) < 0 ? -1 : 1;
}

/* The article's record and verdict, from what its decision chose (a new list of the two bytes). */
static int written_bytes(Engine *e, Fresh *f, int64_t seq, PyObject **record, PyObject **verdict) {
    ArticleOut a;
    memset(&a, 0, sizeof a);
    DecisionOut *d = &a.decision;
    int failed = text_of(f->id, &a.id) < 0 || text_of(f->cluster_id, &a.cluster_id) < 0 ||
                 text_of(f->canonical, &d->canonical) < 0;
    a.seq = seq, a.version = f->version, a.time_ms = f->time_ms, a.cluster = f->cluster;
    a.shingle_count = f->shingle_count;
    a.short_text = f->short_text, a.keys = f->keys;
    d->kind = f->kind, d->has_match = f->match != NULL, d->exact = f->exact;
    failed = failed || PyObject_GetBuffer(f->hash, &a.hash, PyBUF_SIMPLE) < 0 ||
             PyObject_GetBuffer(f->verifier, &a.verifier, PyBUF_SIMPLE) < 0 ||
             (f->width != 1 && PyObject_GetBuffer(f->signature, &a.signature, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) ||
             (f->kind != KIND_DUPLICATE && PyObject_GetBuffer(f->anchors, &a.anchors, PyBUF_SIMPLE) < 0);
    for (int i = 0; i < 3; i++) {
        d->raw[i] = Py_NewRef(d->has_match ? PyTuple_GET_ITEM(f->match_scores, i) : Py_None);
        d->scores[i] = d->has_match ? PyFloat_AsDouble(d->raw[i]) : 0.0;
    }
    PyObject *match_id = d->has_match && !failed ? kept(f, PyObject_GetAttr(f->match, name_article_id)) : NULL;
    failed = failed || (d->has_match && (match_id == NULL || text_of(match_id, &d->match) < 0));
    d->candidate_count = PyList_GET_SIZE(f->kept);
    d->passage_count = PyList_GET_SIZE(f->shared);
    d->candidates = PyMem_Calloc((size_t)d->candidate_count + 1, sizeof(CandidateOut));
    d->passages = PyMem_Calloc((size_t)d->passage_count + 1, sizeof *d->passages);
    failed = failed || d->candidates == NULL || d->passages == NULL;
    for (Py_ssize_t i = 0; i < d->candidate_count && !failed; i++) {
        PyObject *row = PyList_GET_ITEM(f->kept, i);
        failed = text_of(PyTuple_GET_ITEM(row, 0), &d->candidates[i].id) < 0;
        for (int s = 0; s < 3 && !failed; s++) {
            d->candidates[i].scores[s] = PyFloat_AsDouble(PyTuple_GET_ITEM(row, s + 1));
            failed = d->candidates[i].scores[s] == -1.0 && PyErr_Occurred();
        }
    }
    for (Py_ssize_t i = 0; i < d->passage_count && !failed; i++) {
        for (int v = 0; v < 5 && !failed; v++) {
            d->passages[i][v] = PyLong_AsLongLong(PyTuple_GET_ITEM(PyList_GET_ITEM(f->shared, i), v));
            failed = d->passages[i][v] == -1 && PyErr_Occurred();
        }
    }
    Buf out = {0}, json = {0};
    failed = failed || PyErr_Occurred() || record_write(&out, &a) < 0 ||
             verdict_write(&json, &a, PyBytes_AS_STRING(e->audit), PyBytes_GET_SIZE(e->audit), f->latency) < 0;
    if (failed && (d->candidates == NULL || d->passages == NULL) && !PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    *record = failed ? NULL : finished(&out);
    *verdict = failed || *record == NULL ? NULL : finished(&json);
    if (failed) {
        PyMem_Free(out.data);
        PyMem_Free(json.data);
    } else if (*record == NULL) {
        PyMem_Free(json.data);
    }
    article_release(&a);
    if (*record == NULL || *verdict == NULL) {
        Py_CLEAR(*record);
        return -1;
    }
    return 0;
}

/* x<content hash><seq>: an exact copy of a held content, out of the buckets. */
static PyObject *copy_key(PyObject *hash, PyObject *seq_key) {
    PyObject *copy = PyBytes_FromStringAndSize(NULL, PyBytes_GET_SIZE(hash) + 9);
    if (copy != NULL) {
        PyBytes_AS_STRING(copy)[0] = 'x';
        memcpy(PyBytes_AS_STRING(copy) + 1, PyBytes_AS_STRING(hash), (size_t)PyBytes_GET_SIZE(hash));
        memcpy(PyBytes_AS_STRING(copy) + 1 + PyBytes_GET_SIZE(hash), PyBytes_AS_STRING(seq_key), 8);
    }
    return copy;
}

static int put_main(Engine *e, PyObject *key, PyObject *value) {
    int failed = key == NULL || PyDict_SetItem(e->main, key, value) < 0;
    Py_XDECREF(key);
    return failed ? -1 : 0;
}

/* A copy or member key put, and listed where a removal later in the run scans for it. */
static int put_scanned(Engine *e, PyObject *key) {
    int failed = key == NULL || PyDict_SetItem(e->main, key, empty_bytes) < 0 || PyList_Append(e->scanned, key) < 0;
    Py_XDECREF(key);
    return failed ? -1 : 0;
}

/* -- a replaced version taken out (continued) ---------------------------------------------- */

/* A cluster member's key (k<cluster seq><seq>) into `out`, 17 bytes. */
static void member_key(unsigned char *out, int64_t cluster, int64_t seq) {
    out[0] = 'k';
    put_be(out + 1, 8, (uint64_t)cluster);
    put_be(out + 9, 8, (uint64_t)seq);
}

/* An arrival's time-order key (t<time + 2**63><seq>: the arrivals by event time), a new bytes. */
static PyObject *time_key(int64_t time_ms, int64_t seq) {
    unsigned char key[17];
    key[0] = 't';
    put_be(key + 1, 8, (uint64_t)time_ms + TIME_BIAS);
    put_be(key + 9, 8, (uint64_t)seq);
    return PyBytes_FromStringAndSize((const char *)key, 17);
}

/* Arrival `seq_key` joins the buckets `names` as `stored` holds them (_sketch.c's join_buckets),
 * the buckets it creates counted. */
static int buckets_joined(Engine *e, PyObject *names, PyObject *stored, PyObject *seq_key, Added *added) {
    PyObject *args = Py_BuildValue("(OOOnOO)", names, stored, seq_key, e->bucket_bytes, e->main, e->sizes);
    PyObject *created = args ? join_buckets(NULL, args) : NULL;
    Py_XDECREF(args);
    if (created == NULL) {
        return -1;
    }
    added->buckets += PyLong_AsLongLong(created);
    Py_DECREF(created);
    return 0;
}

/* The value of one key as the run leaves it (borrowed from the article's keep). */
static PyObject *left_one(Engine *e, Fresh *f, PyObject *name) {
    PyObject *names = kept(f, PyList_New(1));
    if (names == NULL) {
        return NULL;
    }
    PyList_SET_ITEM(names, 0, Py_NewRef(name));
    PyObject *values = kept(f, left(e, names, e->get_many));
    return values ? PyList_GET_ITEM(values, 0) : NULL;
}

/* `entry` taken out of the lists `names` as the run leaves them (_sketch.c's leave_entries), a
 * new tuple (emptied, unfilled, changed) kept with the article. */
static PyObject *left_out(Engine *e, Fresh *f, PyObject *names, PyObject *reader, PyObject *entry, int masked,
                          Py_ssize_t full, PyObject *sizes) {
    PyObject *stored = kept(f, left(e, names, reader));
    PyObject *args = stored ? Py_BuildValue("(OOOinOO)", names, stored, entry, masked, full, e->main, sizes) : NULL;
    PyObject *result = args ? kept(f, leave_entries(NULL, args)) : NULL;
    Py_XDECREF(args);
    return result;
}

static long long count_at(PyObject *counts, Py_ssize_t i) { return PyLong_AsLongLong(PyTuple_GET_ITEM(counts, i)); }

/* Arrival `heir` joins the buckets `names` where it is not a member already (Buckets.join,
 * if_absent): a copy taking its content over from the version taken out. */
static int joined_again(Engine *e, Fresh *f, PyObject *names, PyObject *heir, Added *added) {
    PyObject *stored = kept(f, left(e, names, e->get_many));
    PyObject *absent = kept(f, PyList_New(0)), *values = kept(f, PyList_New(0));
    if (stored == NULL || absent == NULL || values == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names); i++) {
        PyObject *bucket = PyList_GET_ITEM(stored, i);
        int member = 0;
        for (Py_ssize_t at = 0; PyBytes_Check(bucket) && !member && at + 8 <= PyBytes_GET_SIZE(bucket); at += 8) {
            member = memcmp(PyBytes_AS_STRING(bucket) + at, PyBytes_AS_STRING(heir), 8) == 0;
        }
        if (!member && (PyList_Append(absent, PyList_GET_ITEM(names, i)) < 0 || PyList_Append(values, bucket) < 0)) {
            return -1;
        }
    }
    return buckets_joined(e, absent, values, heir, added);
}

/* The content's holder gone (Contents.remove): the earliest copy beside it takes the content,
 * and its buckets, over; a copy gone leaves its place beside the holder. */
static int content_left(Engine *e, Fresh *f, Stored *s, PyObject *seq_key, PyObject *buckets, Added *added) {
    PyObject *hash = kept(f, PyBytes_FromStringAndSize(s->hash, s->hash_len));
    PyObject *content = hash ? kept(f, prefixed('c', s->hash, s->hash_len)) : NULL;
    PyObject *holder = content ? left_one(e, f, content) : NULL;
    if (holder == NULL) {
        return -1;
    }
    if (!PyBytes_Check(holder) || PyBytes_GET_SIZE(holder) != 8 || memcmp(PyBytes_AS_STRING(holder), PyBytes_AS_STRING(seq_key), 8)) {
        return put_main(e, copy_key(hash, seq_key), Py_None);
    }
    PyObject *copies = kept(f, prefixed('x', s->hash, s->hash_len));
    PyObject *heir = copies ? kept(f, PyObject_CallFunctionObjArgs(e->first_key, copies, seq_key, NULL)) : NULL;
    if (heir == NULL || heir == Py_None) {
        return heir == NULL ? -1 : PyDict_SetItem(e->main, content, Py_None);
    }
    if (!PyBytes_Check(heir) || PyBytes_GET_SIZE(heir) < 8) {
        return invalid("first_key must return a key ending in a seq, or None");
    }
    PyObject *heir_seq = kept(f, PyBytes_FromStringAndSize(PyBytes_AS_STRING(heir) + PyBytes_GET_SIZE(heir) - 8, 8));
    return heir_seq == NULL || PyDict_SetItem(e->main, content, heir_seq) < 0 ||
                   PyDict_SetItem(e->main, heir, Py_None) < 0 || joined_again(e, f, buckets, heir_seq, added) < 0
               ? -1
               : 0;
}

/* Out of its cluster (Clusters.leave): when it was the cluster's head, the earliest member left
 * becomes the head, or the cluster is gone. */
static int cluster_left(Engine *e, Fresh *f, Stored *s, PyObject *seq_key, Added *added) {
    unsigned char member[17];
    member_key(member, s->cluster, s->seq);
    if (s->cluster != s->seq && put_main(e, PyBytes_FromStringAndSize((const char *)member, 17), Py_None) < 0) {
        return -1;
    }
    PyObject *head_key = kept(f, prefixed('h', (const char *)member + 1, 8));
    PyObject *head = head_key ? left_one(e, f, head_key) : NULL;
    if (head == NULL) {
        return -1;
    }
    if (head != Py_None && (!PyBytes_Check(head) || PyBytes_GET_SIZE(head) < 8)) {
        PyErr_Format(e->corrupt, "the head of cluster %lld is not a seq and id", (long long)s->cluster);
        return -1;
    }
    if ((head == Py_None ? s->cluster : (int64_t)seq_of(PyBytes_AS_STRING(head))) != s->seq) {
        return 0;
    }
    /* the first article has no member key: it is never the successor, being the earliest */
    PyObject *members = kept(f, PyBytes_FromStringAndSize((const char *)member, 9));
    PyObject *next = members ? kept(f, PyObject_CallFunctionObjArgs(e->first_key, members, seq_key, NULL)) : NULL;
    if (next == NULL) {
        return -1;
    }
    if (next == Py_None) { /* no member left: the cluster is gone */
        added->clusters--;
        return PyDict_SetItem(e->main, head_key, Py_None);
    }
    if (!PyBytes_Check(next) || PyBytes_GET_SIZE(next) < 8) {
        return invalid("first_key must return a key ending in a seq, or None");
    }
    const char *next_seq = PyBytes_AS_STRING(next) + PyBytes_GET_SIZE(next) - 8;
    PyObject *probe = kept(f, probe_at(e, (int64_t)seq_of(next_seq)));
    PyObject *id = probe ? kept(f, PyObject_GetAttr(probe, name_article_id)) : NULL;
    Py_ssize_t id_len;
    const char *utf8 = id ? PyUnicode_AsUTF8AndSize(id, &id_len) : NULL;
    PyObject *entry = utf8 ? kept(f, PyBytes_FromStringAndSize(NULL, 8 + id_len)) : NULL;
    if (entry == NULL) {
        return -1;
    }
    memcpy(PyBytes_AS_STRING(entry), next_seq, 8);
    memcpy(PyBytes_AS_STRING(entry) + 8, utf8, (size_t)id_len);
    return PyDict_SetItem(e->main, head_key, entry);
}

/* The version the article replaces taken out of the index, into the run's writes, as index.py's
 * _remove takes it out (the reference the tests compare with): its buckets, its posting lists,
 * its content, its cluster, its place in the time order, its record. */
static int taken_out(Engine *e, Fresh *f, Added *added) {
    Stored s = f->old;
    PyObject *seq_key = kept(f, seq_bytes(s.seq));
    PyObject *buckets = seq_key ? kept(f, PyList_New(0)) : NULL;
    if (buckets == NULL) {
        return -1;
    }
    for (Py_ssize_t band = 0; band < s.digests_len / DIGEST_BYTES; band++) {
        unsigned char key[BAND_INDEX + DIGEST_BYTES];
        put_be(key, BAND_INDEX, (uint64_t)band);
        memcpy(key + BAND_INDEX, s.digests + band * DIGEST_BYTES, DIGEST_BYTES);
        if (name_added(buckets, prefixed('b', (const char *)key, sizeof key)) < 0) {
            return -1;
        }
    }
    PyObject *left_buckets = left_out(e, f, buckets, e->get_many, seq_key, 0, 0, e->sizes);
    if (left_buckets == NULL) {
        return -1;
    }
    added->buckets -= count_at(left_buckets, 0);
    if (s.in_postings && s.anchors_len) {
        unsigned char low[POSTING_ENTRY];
        put_be(low, POSTING_ENTRY, (uint64_t)(s.seq & POSTING_SEQS));
        PyObject *anchors = kept(f, PyBytes_FromStringAndSize(s.anchors, s.anchors_len));
        PyObject *names = anchors ? kept(f, anchor_names(anchors)) : NULL;
        PyObject *entry = names ? kept(f, PyBytes_FromStringAndSize((const char *)low, POSTING_ENTRY)) : NULL;
        PyObject *lists = entry ? left_out(e, f, names, e->read_postings, entry, 1, e->posting_bytes, Py_None) : NULL;
        if (lists == NULL) {
            return -1;
        }
        added->postings -= count_at(lists, 0);
        added->boilerplate -= count_at(lists, 1);
        PyObject *changed = PyTuple_GET_ITEM(lists, 2);
        if (PyList_GET_SIZE(changed) && PyList_Append(e->postings_written, changed) < 0) {
            return -1;
        }
    }
    if (content_left(e, f, &s, seq_key, buckets, added) < 0 || cluster_left(e, f, &s, seq_key, added) < 0) {
        return -1;
    }
    PyObject *when = kept(f, time_key(s.time_ms, s.seq));
    if (when == NULL || PyDict_SetItem(e->main, when, Py_None) < 0 || PyList_Append(e->times_written, when) < 0 ||
        PyDict_SetItem(e->records, seq_key, Py_None) < 0) {
        return -1;
    }
    added->articles--;
    return 0;
}

/* A revived id's deletion marker dropped, with its place in the marker time order (Markers.drop). */
static int marker_dropped(Engine *e, Fresh *f) {
    Py_ssize_t id_len;
    const char *utf8 = PyUnicode_AsUTF8AndSize(f->id, &id_len);
    PyObject *when = utf8 ? PyBytes_FromStringAndSize(NULL, 9 + id_len) : NULL;
    if (when == NULL) {
        return -1;
    }
    PyBytes_AS_STRING(when)[0] = 'e';
    memcpy(PyBytes_AS_STRING(when) + 1, PyBytes_AS_STRING(f->replaced) + 8, 8);
    memcpy(PyBytes_AS_STRING(when) + 9, utf8, (size_t)id_len);
    return put_main(e, when, Py_None) < 0 || put_main(e, prefixed_text('d', f->id), Py_None) < 0 ? -1 : 0;
}

/* The version the article replaces taken out, or the revived id's marker dropped; then its
 * buckets and posting lists are read again, as that may have written them. The decision read
 * them before: as reference_decide.py's decide, which decides a new version beside the one it
 * replaces (never its candidate). */
static int replaced(Engine *e, Fresh *f, Added *added) {
    if ((f->revived ? marker_dropped(e, f) : taken_out(e, f, added)) < 0) {
        return -1;
    }
    if (f->buckets != NULL && (f->buckets = kept(f, left(e, f->bucket_names, e->get_many))) == NULL) {
        return -1;
    }
    if (f->postings != NULL && (f->postings = kept(f, left(e, f->posting_names, e->read_postings))) == NULL) {
        return -1;
    }
    return 0;
}

/* The article indexed (index.py's apply of a new article that no content map entry names): the
 * content map, its buckets, its posting lists, its cluster, the time order, the id map and its
 * record, into the run's writes. */
static int index_one(Engine *e, Fresh *f, int64_t seq, PyObject *record, Added *added) {
    PyObject *seq_key = kept(f, seq_bytes(seq));
    if (seq_key == NULL) {
        return -1;
    }
    if (f->exact) { /* beside its content's holder (x<hash><seq>), out of the buckets: the holder stands for it */
        if (put_scanned(e, copy_key(f->hash, seq_key)) < 0) {
            return -1;
        }
    } else {
        /* Not an exact copy, yet its content is held: the holder had expired (or is gone), and
         * this article stands for the content from now on, the holder beside it as a copy. */
        if (f->holder != NULL && put_scanned(e, copy_key(f->hash, f->holder)) < 0) {
            return -1;
        }
        PyObject *content = prefixed('c', PyBytes_AS_STRING(f->hash), PyBytes_GET_SIZE(f->hash));
        if (put_main(e, content, seq_key) < 0 || buckets_joined(e, f->bucket_names, f->buckets, seq_key, added) < 0) {
            return -1;
        }
    }
    if (f->kind != KIND_DUPLICATE) { /* a duplicate joins no posting list: its match holds the text */
        if (posting_names(f) == NULL) {
            return -1;
        }
        Py_ssize_t count = PyList_GET_SIZE(f->posting_names);
        if (count && f->postings == NULL) {
            f->postings = kept(f, left(e, f->posting_names, e->read_postings));
            if (f->postings == NULL) {
                return -1;
            }
        }
        if (count) {
            unsigned char entry[POSTING_ENTRY];
            put_be(entry, POSTING_ENTRY, (uint64_t)((seq & POSTING_SEQS) | (count < 2 ? FEW_ANCHORS : 0)));
            PyObject *join = Py_BuildValue("(OOy#nO)", f->posting_names, f->postings, entry, (Py_ssize_t)POSTING_ENTRY,
                                           e->posting_bytes, e->main);
            PyObject *joined = join ? join_postings(NULL, join) : NULL;
            Py_XDECREF(join);
            if (joined == NULL) {
                return -1;
            }
            added->postings += PyLong_AsLongLong(PyTuple_GET_ITEM(joined, 0));
            added->boilerplate += PyLong_AsLongLong(PyTuple_GET_ITEM(joined, 1));
            Py_DECREF(joined);
            if (PyList_Append(e->postings_written, f->posting_names) < 0) {
                return -1;
            }
        }
    }
    if (f->cluster == seq) {
        added->clusters++;
    } else {
        unsigned char member[17];
        member_key(member, f->cluster, seq);
        if (put_scanned(e, PyBytes_FromStringAndSize((const char *)member, 17)) < 0) {
            return -1;
        }
    }
    PyObject *when = kept(f, time_key(f->time_ms, seq));
    if (when == NULL || PyDict_SetItem(e->main, when, empty_bytes) < 0 || PyList_Append(e->times_written, when) < 0 ||
        put_main(e, prefixed_text('a', f->id), seq_key) < 0 ||
        PyDict_SetItem(e->records, seq_key, record) < 0) {
        return -1;
    }
    added->articles++;
    if (!added->has_newest || f->time_ms > added->newest) {
        added->has_newest = 1, added->newest = f->time_ms;
    }
    return 0;
}

/* What scoring the article compares (Fresh: slots, width, chance): its verifier, or without one
 * its signature's values as little-endian bytes, as a record without a verifier keeps them (and
 * a signed record does: a signature of bytes is taken as it is). */
static int slots_read(Engine *e, Fresh *f) {
    Py_buffer view;
    if (PyObject_GetBuffer(f->verifier, &view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    Py_ssize_t size = view.len;
    PyBuffer_Release(&view);
    if (size) {
        f->slots = f->verifier, f->width = 1, f->chance = e->chance;
        return 0;
    }
    if (PyObject_GetBuffer(f->signature, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    const char *format = view.format ? view.format : "B";
    int little_endian = view.itemsize == 1;
    if ((!little_endian && (view.itemsize != 8 || format[0] == '>' || format[0] == '!')) || view.len % 8) {
        PyBuffer_Release(&view);
        return invalid("a signature must be 8-byte integers in the machine's order, or their bytes little-endian");
    }
    PyObject *slots = PyBytes_FromStringAndSize(little_endian ? view.buf : NULL, view.len);
    for (Py_ssize_t i = 0; slots != NULL && !little_endian && i < view.len; i += 8) {
        uint64_t value;
        memcpy(&value, (const char *)view.buf + i, 8);
        for (int k = 0; k < 8; k++, value >>= 8) {
            PyBytes_AS_STRING(slots)[i + k] = (char)(value & 0xFF);
        }
    }
    PyBuffer_Release(&view);
    f->slots = kept(f, slots), f->width = 8, f->chance = 0.0;
    return f->slots == NULL ? -1 : 0;
}

static int item_read(Engine *e, Fresh *f, PyObject *item) {
    PyObject *cutoff;
    int short_text;
    long long shingle_count, time_ms;
    if (!PyTuple_Check(item) ||
        !PyArg_ParseTuple(item, "UO!O!OOLpO!LOO", &f->id, &PyBytes_Type, &f->hash, &PyTuple_Type, &f->keys, &f->verifier,
                          &f->signature,
                          &shingle_count, &short_text, &PyBytes_Type, &f->anchors, &time_ms, &cutoff, &f->latency)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "an item must be a tuple");
        }
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(f->keys); i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(f->keys, i))) {
            return invalid("an item's band keys must be bytes");
        }
    }
    if (f->latency != Py_None && !PyFloat_Check(f->latency)) {
        PyErr_SetString(PyExc_TypeError, "latency_ms must be a float or None");
        return -1;
    }
    f->shingle_count = shingle_count, f->short_text = short_text, f->time_ms = time_ms;
    f->has_cutoff = cutoff != Py_None;
    long long bound = f->has_cutoff ? PyLong_AsLongLong(cutoff) : 0;
    f->cutoff = bound;
    return (bound == -1 && PyErr_Occurred()) || slots_read(e, f) < 0 ? -1 : 0;
}

static int engine_read(Engine *e, PyObject *context) {
    PyObject *settings;
    if (!PyArg_ParseTuple(context, "OOOOOOO!O!O!O!O!O!OnO!O!", &e->get_many, &e->read_postings, &e->prospects,
                          &e->probe_of, &e->first_key, &e->corrupt, &PyDict_Type, &e->main, &PyDict_Type,
                          &e->records, &PyList_Type, &e->times_written, &PyList_Type, &e->postings_written,
                          &PyList_Type, &e->scanned, &PyList_Type, &e->sizes, &e->before, &e->before_base,
                          &PyBytes_Type, &e->audit, &PyTuple_Type, &settings)) {
        return -1;
    }
    int lookup;
    if (!PyArg_ParseTuple(settings, "nnnnnndddpidnnnn", &e->bucket_bytes, &e->posting_bytes, &e->max_candidates,
                          &e->top_candidates, &e->anchor_candidates, &e->passage_limit, &e->threshold,
                          &e->containment, &e->revised, &lookup, &e->empty_slot, &e->chance, &e->k, &e->gap,
                          &e->shift, &e->repeats)) {
        return -1;
    }
    e->anchor_lookup = lookup;
    if (e->max_candidates < 0 || e->anchor_candidates < 0 || e->top_candidates < 0) {
        return invalid("candidate counts must be >= 0");
    }
    return 0;
}

/* What the run's decisions will read, read before the first: one multi-get of the articles' id
 * map, deletion marker and content keys, one of their band keys, one of their posting lists, then
 * one read of the records their stored buckets and contents name. A decision reads again only what
 * this did not foresee. Items it cannot read are left to their decision, which says what is wrong
 * with them (band keys that are not bytes leave the whole read to the decisions). */
static int read_ahead(Engine *e, PyObject *items) {
    Py_ssize_t count = PyList_GET_SIZE(items);
    /* a reader's call reads one family (state/held.py): the id map, markers and contents apart
     * from the buckets, and the posting lists */
    PyObject *firsts = PyList_New(0), *bucket_names = PyList_New(0), *postings = PyList_New(0);
    PyObject *seqs = PyList_New(0), *found = NULL, *buckets = NULL, *read = NULL;
    Py_ssize_t *bands = PyMem_Calloc((size_t)count + 1, sizeof *bands); /* each item's band keys */
    int failed = firsts == NULL || bucket_names == NULL || postings == NULL || seqs == NULL || bands == NULL;
    for (Py_ssize_t i = 0; !failed && i < count; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 11 || !PyUnicode_Check(PyTuple_GET_ITEM(item, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(item, 1)) || !PyTuple_Check(PyTuple_GET_ITEM(item, 2))) {
            bands[i] = -1;
            continue;
        }
        PyObject *anchors = PyTuple_GET_ITEM(item, 7), *keys = PyTuple_GET_ITEM(item, 2);
        bands[i] = PyTuple_GET_SIZE(keys);
        failed = first_names(firsts, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1)) < 0 ||
                 band_names(bucket_names, keys) < 0;
        if (!failed && e->anchor_lookup && PyBytes_Check(anchors) && PyBytes_GET_SIZE(anchors)) {
            PyObject *mine = anchor_names(anchors);
            failed = mine == NULL || PyList_SetSlice(postings, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, mine) < 0;
            Py_XDECREF(mine);
        }
    }
    failed = failed || (found = left(e, firsts, e->get_many)) == NULL ||
             (buckets = left(e, bucket_names, e->get_many)) == NULL ||
             (PyList_GET_SIZE(postings) && (read = left(e, postings, e->read_postings)) == NULL);
    /* the records named: the version held, the content's holder, the stored buckets' first seqs
     * as the decision merges them */
    for (Py_ssize_t i = 0, at = 0, band = 0; !failed && i < count; i++) {
        if (bands[i] < 0) {
            continue;
        }
        for (int named = 0; named < 3 && !failed; named += 2) { /* the version held, the content's holder */
            PyObject *held = PyList_GET_ITEM(found, at + named);
            if (PyBytes_Check(held) && PyBytes_GET_SIZE(held) == 8) {
                PyObject *seq = PyLong_FromUnsignedLongLong(seq_of(PyBytes_AS_STRING(held)));
                failed = seq == NULL || PyList_Append(seqs, seq) < 0;
                Py_XDECREF(seq);
            }
        }
        PyObject *mine = failed ? NULL : PyList_GetSlice(buckets, band, band + bands[i]);
        PyObject *args = mine ? Py_BuildValue("(On)", mine, e->max_candidates + 1) : NULL;
        PyObject *merged = args ? merge_buckets(NULL, args) : NULL;
        failed = merged == NULL || PyList_SetSlice(seqs, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, merged) < 0;
        Py_XDECREF(mine);
        Py_XDECREF(args);
        Py_XDECREF(merged);
        at += 3, band += bands[i];
    }
    PyObject *probes = failed || !PyList_GET_SIZE(seqs) ? NULL : probes_of(e, seqs);
    failed = failed || (PyList_GET_SIZE(seqs) && probes == NULL);
    Py_XDECREF(probes);
    PyMem_Free(bands);
    Py_XDECREF(firsts);
    Py_XDECREF(bucket_names);
    Py_XDECREF(postings);
    Py_XDECREF(seqs);
    Py_XDECREF(found);
    Py_XDECREF(buckets);
    Py_XDECREF(read);
    return failed ? -1 : 0;
}

static PyObject *decide_fresh(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *items, *context;
    long long first_seq;
    Engine e;
    if (!PyArg_ParseTuple(args, "O!LO!", &PyList_Type, &items, &first_seq, &PyTuple_Type, &context) ||
        engine_read(&e, context) < 0) {
        return NULL;
    }
    Added added = {0};
    added.seq = first_seq;
    e.read = PyDict_New(), e.probes = PyDict_New(), e.own_records = PyDict_New();
    PyObject *results = e.read && e.probes && e.own_records ? PyList_New(0) : NULL;
    Py_ssize_t done = 0;
    for (; results != NULL && done < PyList_GET_SIZE(items); done++) {
        if (e.before != Py_None) {
            PyObject *at = PyLong_FromSsize_t(e.before_base + done);
            PyObject *marked = at ? PyObject_CallOneArg(e.before, at) : NULL;
            Py_XDECREF(at);
            if (marked == NULL) {
                Py_CLEAR(results);
                break;
            }
            Py_DECREF(marked);
        }
        /* read as the first article's decision starts (what `before` marks: a process that dies
         * reading is on that article, as it was when each decision read for itself) */
        if (done == 0 && read_ahead(&e, items) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                Py_CLEAR(results);
                break;
            }
            PyErr_Clear(); /* each decision reads what it needs, and raises where it belongs */
        }
        Fresh f;
        memset(&f, 0, sizeof f);
        f.keep = PyList_New(0);
        if (f.keep == NULL || item_read(&e, &f, PyList_GET_ITEM(items, done)) < 0) {
            Py_XDECREF(f.keep);
            Py_CLEAR(results);
            break;
        }
        int decided = decide_one(&e, &f, added.seq);
        if (decided < 0 && done > 0 && PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear(); /* the next run, of its own, decides it again, or raises */
            decided = 0;
        }
        PyObject *record = NULL, *verdict = NULL, *row = NULL;
        int failed = decided < 0 || (decided > 0 && (written_bytes(&e, &f, added.seq, &record, &verdict) < 0 ||
                                                      (f.replaces && replaced(&e, &f, &added) < 0) ||
                                                      index_one(&e, &f, added.seq, record, &added) < 0 ||
                                                      (row = Py_BuildValue("(OOsO)", record, verdict, kind_names[f.kind],
                                                                           f.revived ? Py_True : Py_False)) == NULL ||
                                                      PyList_Append(results, row) < 0));
        Py_XDECREF(row);
        Py_XDECREF(verdict);
        if (!failed && decided > 0) {
            PyObject *seq = PyLong_FromLongLong(added.seq);
            failed = seq == NULL || PyDict_SetItem(e.own_records, seq, record) < 0;
            Py_XDECREF(seq);
            added.seq++;
        }
        Py_XDECREF(record);
        Py_DECREF(f.keep);
        if (failed) {
            Py_CLEAR(results);
        }
        if (decided == 0 || failed) {
            break;
        }
    }
    Py_XDECREF(e.read);
    Py_XDECREF(e.probes);
    Py_XDECREF(e.own_records);
    if (results == NULL) {
        return NULL;
    }
    PyObject *newest = added.has_newest ? PyLong_FromLongLong(added.newest) : Py_NewRef(Py_None);
    PyObject *counts = newest ? Py_BuildValue("(LLLLLOL)", added.buckets, added.postings, added.boilerplate,
                                              added.clusters, added.articles, newest, (long long)added.seq)
                              : NULL;
    Py_XDECREF(newest);
    PyObject *result = counts ? Py_BuildValue("(NnN)", results, done, counts) : NULL;
    if (result == NULL) {
        Py_DECREF(results);
    }
    return result;
}

PyObject *made(PyTypeObject *type, PyObject **values, Py_ssize_t count) {
    PyObject *items = PyTuple_New(count);
    if (items == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyTuple_SET_ITEM(items, i, Py_NewRef(values[i]));
    }
    PyObject *args = PyTuple_Pack(1, items);
    Py_DECREF(items);
    PyObject *made = args == NULL ? NULL : PyTuple_Type.tp_new(type, args, NULL);
    Py_XDECREF(args);
    return made;
}

/* -- a signed record read (pipeline/wire.py's S6 layout) -------------------------------------- */

/* A cursor over the meta JSON of a signed record as orjson writes it: its keys in encode_signed's
 * order, no whitespace. Anything else (an escape in a string, another key, a number past 64 bits)
 * stops the cursor, and the record is left to the Python decoder, which takes JSON as it comes. */
typedef struct {
    const char *at, *end;
    int ok;
} Meta;

static void meta_expect(Meta *m, const char *text) {
    size_t n = strlen(text);
    if (m->ok && (size_t)(m->end - m->at) >= n && memcmp(m->at, text, n) == 0) {
        m->at += n;
    } else {
        m->ok = 0;
    }
}

/* A string with no escape in it, as its bytes (which the caller decodes); its quotes consumed. */
static Py_ssize_t meta_string(Meta *m, const char **text) {
    meta_expect(m, "\"");
    const char *start = m->at;
    while (m->ok && m->at < m->end && *m->at != '"') {
        if (*m->at == '\\' || (unsigned char)*m->at < 0x20) {
            m->ok = 0;
        }
        m->at++;
    }
    meta_expect(m, "\"");
    *text = start;
    return m->at - start - 1;
}

/* An integer as JSON writes one (no leading zero), within int64. */
static long long meta_int(Meta *m) {
    int negative = m->ok && m->at < m->end && *m->at == '-';
    m->at += negative;
    const char *start = m->at;
    uint64_t value = 0, most = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    while (m->ok && m->at < m->end && *m->at >= '0' && *m->at <= '9') {
        unsigned digit = (unsigned)(*m->at++ - '0');
        if (value > (most - digit) / 10) {
            m->ok = 0;
        }
        value = value * 10 + digit;
    }
    if (m->at == start || (*start == '0' && m->at - start > 1)) {
        m->ok = 0;
    }
    return negative ? (long long)(0 - value) : (long long)value;
}

/* An integer, or None for null: a new reference, NULL where the cursor stopped or on failure. */
static PyObject *meta_int_or_null(Meta *m) {
    if (m->ok && m->end - m->at >= 4 && memcmp(m->at, "null", 4) == 0) {
        m->at += 4;
        return Py_NewRef(Py_None);
    }
    long long value = meta_int(m);
    return m->ok ? PyLong_FromLongLong(value) : NULL;
}

static int meta_bool(Meta *m) {
    if (m->ok && m->end - m->at >= 4 && memcmp(m->at, "true", 4) == 0) {
        m->at += 4;
        return 1;
    }
    meta_expect(m, "false");
    return 0;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Whether text[:len] is base64 as base64.b64encode writes it: groups of four of its alphabet, the
 * last padded with at most two '=' (what b64decode takes without complaint). */
static int canonical_base64(const char *text, Py_ssize_t len) {
    if (len % 4) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        char c = text[i];
        int padding = c == '=' && i >= len - 2 && (i == len - 1 || text[len - 1] == '=');
        int letter = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!(letter || c == '+' || c == '/' || padding)) {
            return 0;
        }
    }
    return 1;
}

/* Whether a feed record's head (with_original: its input message's headers, a JSON list of
 * [name, base64 value] pairs) is as orjson writes it, the names printable ASCII: what
 * wire._unwrapped takes apart the same. */
static int feed_head(const char *head, Py_ssize_t len) {
    Meta m = {head, head + len, 1};
    meta_expect(&m, "[");
    for (int first = 1; m.ok && m.at < m.end && *m.at != ']'; first = 0) {
        const char *name, *value;
        if (!first) {
            meta_expect(&m, ",");
        }
        meta_expect(&m, "[");
        Py_ssize_t name_len = meta_string(&m, &name);
        meta_expect(&m, ",");
        Py_ssize_t value_len = meta_string(&m, &value);
        meta_expect(&m, "]");
        for (Py_ssize_t i = 0; m.ok && i < name_len; i++) {
            m.ok = (unsigned char)name[i] >= 0x20 && (unsigned char)name[i] < 0x7F;
        }
        m.ok = m.ok && canonical_base64(value, value_len);
    }
    meta_expect(&m, "]");
    return m.ok && m.at == m.end;
}

/* The signed record a feed record wraps (wire.with_original: its input message, that message's
 * headers, then the record), decoded, or None as signed_from gives it. */
static PyObject *feed_inner(const char *data, Py_ssize_t len, PyTypeObject *signed_type,
                            PyTypeObject *provenance_type) {
    if (len < 6) {
        return Py_NewRef(Py_None);
    }
    Py_ssize_t size = (Py_ssize_t)get_be(data + 2, 4);
    if (size > len - 6 - 4) {
        return Py_NewRef(Py_None);
    }
    Py_ssize_t head_at = 6 + size + 4, head_len = (Py_ssize_t)get_be(data + 6 + size, 4);
    if (head_len > len - head_at || !feed_head(data + head_at, head_len)) {
        return Py_NewRef(Py_None);
    }
    Py_ssize_t inner_at = head_at + head_len;
    if (len - inner_at < 2 || memcmp(data + inner_at, "S6", 2) != 0) {
        return Py_NewRef(Py_None); /* a record of another kind inside: decoded_signed's to refuse */
    }
    return signed_from(data + inner_at, len - inner_at, signed_type, provenance_type);
}

PyObject *signed_from(const char *data, Py_ssize_t len, PyTypeObject *signed_type, PyTypeObject *provenance_type) {
    PyObject *fields[12] = {NULL}, *src[4] = {NULL}, *result = NULL;
    if (len >= 2 && memcmp(data, "SF", 2) == 0) {
        return feed_inner(data, len, signed_type, provenance_type);
    }
    if (len < 6 || memcmp(data, "S6", 2) != 0) {
        goto declined;
    }
    Py_ssize_t meta_len = (Py_ssize_t)get_be(data + 2, 4);
    if (meta_len > len - 6 - 4) {
        goto declined;
    }
    Meta m = {data + 6, data + 6 + meta_len, 1};
    const char *id, *hash, *topic;
    meta_expect(&m, "{\"id\":");
    Py_ssize_t id_len = meta_string(&m, &id);
    meta_expect(&m, ",\"h\":");
    Py_ssize_t hash_len = meta_string(&m, &hash);
    meta_expect(&m, ",\"n\":");
    long long shingle_count = meta_int(&m);
    meta_expect(&m, ",\"s\":");
    int short_text = meta_bool(&m);
    meta_expect(&m, ",\"m\":");
    long long slots = meta_int(&m);
    meta_expect(&m, ",\"src\":[");
    Py_ssize_t topic_len = meta_string(&m, &topic);
    meta_expect(&m, ",");
    src[1] = meta_int_or_null(&m);
    meta_expect(&m, ",");
    long long offset = meta_int(&m);
    meta_expect(&m, ",");
    src[3] = meta_int_or_null(&m);
    meta_expect(&m, "],\"t\":");
    long long time_ms = meta_int(&m);
    meta_expect(&m, ",\"r\":");
    int refused = meta_bool(&m);
    meta_expect(&m, ",\"a\":");
    long long anchors = meta_int(&m);
    meta_expect(&m, "}");
    if (PyErr_Occurred()) {
        goto done;
    }
    if (!m.ok || m.at != m.end || hash_len % 2 || src[1] == NULL || src[3] == NULL) {
        goto declined;
    }
    Py_ssize_t at = 6 + meta_len;
    Py_ssize_t bands = (Py_ssize_t)get_be(data + at, 2), rows = (Py_ssize_t)get_be(data + at + 2, 2);
    at += 4;
    /* what follows: the keys, the anchors, the signature, then at least nothing (the verifier) */
    if (bands * BAND_KEY_BYTES > len - at || anchors < 0 || anchors > (len - at - bands * BAND_KEY_BYTES) / ANCHOR_BYTES || slots <= 0 ||
        slots > (len - at - bands * BAND_KEY_BYTES - anchors * ANCHOR_BYTES) / 8) {
        goto declined;
    }
    if ((fields[0] = PyUnicode_DecodeUTF8(id, id_len, "strict")) == NULL ||
        (src[0] = PyUnicode_DecodeUTF8(topic, topic_len, "strict")) == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            goto done;
        }
        PyErr_Clear();
        goto declined;
    }
    if ((fields[1] = PyBytes_FromStringAndSize(NULL, hash_len / 2)) == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < hash_len; i += 2) {
        int high = hex_digit(hash[i]), low = hex_digit(hash[i + 1]);
        if (high < 0 || low < 0) {
            goto declined;
        }
        PyBytes_AS_STRING(fields[1])[i / 2] = (char)(high << 4 | low);
    }
    if ((fields[2] = PyTuple_New(bands)) == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < bands; i++, at += BAND_KEY_BYTES) {
        PyObject *key = PyBytes_FromStringAndSize(data + at, BAND_KEY_BYTES);
        if (key == NULL) {
            goto done;
        }
        PyTuple_SET_ITEM(fields[2], i, key);
    }
    Py_ssize_t anchors_at = at, signature_at = at + (Py_ssize_t)anchors * ANCHOR_BYTES;
    Py_ssize_t verifier_at = signature_at + (Py_ssize_t)slots * 8;
    fields[3] = PyBytes_FromStringAndSize(data + verifier_at, len - verifier_at);
    fields[4] = PyBytes_FromStringAndSize(data + signature_at, verifier_at - signature_at);
    fields[5] = PyLong_FromLongLong(shingle_count);
    fields[6] = PyBool_FromLong(short_text);
    fields[7] = PyBytes_FromStringAndSize(data + anchors_at, signature_at - anchors_at);
    src[2] = PyLong_FromLongLong(offset);
    fields[9] = Py_BuildValue("(nn)", bands, rows);
    fields[10] = PyLong_FromLongLong(time_ms);
    fields[11] = PyBool_FromLong(refused);
    for (int i = 0; i < 12; i++) {
        if (i != 8 && fields[i] == NULL) {
            goto done;
        }
    }
    if (src[2] == NULL || (fields[8] = made(provenance_type, src, 4)) == NULL) {
        goto done;
    }
    result = made(signed_type, fields, 12);
    goto done;
declined:
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 12; i++) {
        Py_XDECREF(fields[i]);
    }
    for (int i = 0; i < 4; i++) {
        Py_XDECREF(src[i]);
    }
    return result;
}

int tuple_types(PyTypeObject *signed_type, PyTypeObject *provenance_type) {
    if (!PyType_IsSubtype(signed_type, &PyTuple_Type) || !PyType_IsSubtype(provenance_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "a signed record is made into tuple types");
        return -1;
    }
    return 0;
}

/* signed_record(data, signed_type, provenance_type) -> signed_type | None
 *     A signed record as encode_signed writes it, decoded: the fields of wire.Signed in its order,
 *     made into `signed_type` (its provenance into `provenance_type`: both tuple types, as
 *     NamedTuple makes them) with no Python code run; a feed record (with_original) the record it
 *     wraps. None for any other record, left to wire.decoded_signed, which decodes every record
 *     that this does the same. */
static PyObject *signed_record(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    PyTypeObject *signed_type, *provenance_type;
    if (!PyArg_ParseTuple(args, "y*O!O!", &view, &PyType_Type, &signed_type, &PyType_Type, &provenance_type)) {
        return NULL;
    }
    PyObject *result = tuple_types(signed_type, provenance_type) < 0
                           ? NULL
                           : signed_from(view.buf, view.len, signed_type, provenance_type);
    PyBuffer_Release(&view);
    return result;
}

PyMethodDef decide_methods[] = {
    {"encode_record", encode_record, METH_O, "An indexed article's state record (state/records.py's layout)."},
    {"verdict_json", verdict_json, METH_VARARGS, "An indexed article's verdict as orjson writes verdict_dict."},
    {"decide_fresh", decide_fresh, METH_VARARGS, "A run of articles new to the index decided and indexed in order."},
    {"signed_record", signed_record, METH_VARARGS, "A signed record as encode_signed writes it, or None."},
    {NULL, NULL, 0, NULL},
};

int decide_init(void) {
    struct {
        PyObject **name;
        const char *text;
    } names[] = {
        {&name_article_id, "article_id"}, {&name_version, "version"},   {&name_seq, "seq"},
        {&name_time_ms, "time_ms"},       {&name_cluster, "cluster"},   {&name_cluster_id, "cluster_id"},
        {&name_keys, "keys"},             {&name_sketch, "sketch"},     {&name_decision, "decision"},
        {&name_content_hash, "content_hash"}, {&name_verifier, "verifier"}, {&name_signature, "signature"},
        {&name_shingle_count, "shingle_count"}, {&name_short, "short"}, {&name_anchors, "anchors"},
        {&name_packed, "packed"},         {&name_kind, "kind"},         {&name_match_id, "match_id"},
        {&name_jaccard, "jaccard"},       {&name_containment, "containment"}, {&name_contains, "contains"},
        {&name_canonical_id, "canonical_id"}, {&name_exact, "exact"}, {&name_candidates, "candidates"},
        {&name_passages, "passages"},     {&name_start, "start"},       {&name_end, "end"},
        {&name_other_start, "other_start"}, {&name_other_end, "other_end"},
        {&name_anchor_count, "anchor_count"}, {&name_record, "record"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (*names[i].name == NULL && (*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return -1;
        }
    }
    if (empty_bytes == NULL && (empty_bytes = PyBytes_FromStringAndSize("", 0)) == NULL) {
        return -1;
    }
    return 0;
}
