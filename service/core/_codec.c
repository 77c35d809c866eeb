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

#include "_codec.h"

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
    *name_start, *name_end, *name_other_start, *name_other_end;

/* An attribute of `owner`, kept until the article is released (NULL: an error is set). */
static PyObject *held_attr(ArticleOut *a, PyObject *owner, PyObject *name) {
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value != NULL) {
        if (a->held_count == (int)(sizeof a->held / sizeof a->held[0])) {
            Py_DECREF(value);
            PyErr_SetString(PyExc_RuntimeError, "_codec: too many attributes held");
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
#define BAND_INDEX 2 /* a band key's index bytes, which its position gives back */
#define ANCHOR_BYTES 5
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
    uint64_t head[] = {(uint64_t)a->seq,
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
    for (size_t i = 0; i < sizeof head / sizeof head[0] && !failed; i++) {
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

PyMethodDef codec_methods[] = {
    {"encode_record", encode_record, METH_O, "An indexed article's state record (state/records.py's layout)."},
    {"verdict_json", verdict_json, METH_VARARGS, "An indexed article's verdict as orjson writes verdict_dict."},
    {NULL, NULL, 0, NULL},
};

int codec_init(void) {
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
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (*names[i].name == NULL && (*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return -1;
        }
    }
    return 0;
}
