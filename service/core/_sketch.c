/* The loops of signing, verification and the index in C, which the package requires: the same
 * arithmetic as their numpy references (tests/support/reference_sketch.py, reference_anchors.py and
 * reference_state.py, and dedup.py's _ranked), in one pass over the data instead of a dozen array
 * passes with their temporaries.
 *
 * oph_minima(units, k, seed_key, minima[, width]) -> distinct
 *     units: uint64 buffer (code points or word hashes), or uint32 (code points) with width 4, at
 *     least k of them. For every window of k units: the polynomial shingle hash (shingle.py:
 *     h = h * POLY + unit, mod 2**64), permuted by fmix64(h ^ seed_key) (reference_sketch.py:
 *     permuted), kept in `minima` (a writable uint64 buffer of num_bins items, filled with
 *     EMPTY_SLOT by the caller) if it is the least of its bin (reference_sketch.py: bin_minima).
 *     Returns the number of distinct shingle hashes.
 *
 * finish(wide, num_perm, empty, empty_slot, signature, verifier) -> unfilled
 *     wide: the verifier's bin minima (uint64, a multiple of num_perm of them, `empty` where a bin
 *     got none). Writes the signature (a writable uint64 buffer of num_perm slots: the least of each
 *     group of consecutive bins, reference_sketch.py: finished) and the 8-bit verifier (a writable
 *     uint8 buffer, one byte a bin: the low 8 bits, a real minimum reading as `empty_slot` made
 *     empty_slot - 1; reference_sketch.py: narrow_verifier). Returns how many signature slots
 *     stayed empty (the caller densifies them; news-sized texts leave none).
 *
 * band_keys(signature, bands, rows) -> list of bytes
 *     signature: uint64 buffer of at least bands * rows slots. For each band, 2 bytes of its index
 *     (big-endian) and the first 8 bytes of MurmurHash3_x64_128 (seed 0) of its rows' bytes: what
 *     reference_sketch.band_keys computes with mmh3.hash_bytes, one Python call per band.
 *
 * collapse_spaces(points, is_space, out) -> length
 *     points: uint32 code points; is_space: a bool (uint8) table by code point; out: a writable
 *     uint32 buffer at least as long as points. Writes the points with every run of spaces made one
 *     U+0020 and none at either end (reference_sketch.py: collapse_spaces) and returns how many.
 *
 * scores(query, candidates, size_a, empty, chance[, width]) -> (jaccard, containment, contains)
 *     query: uint8 buffer of m verifier slots; candidates: a sequence of objects with a `verifier`
 *     (uint8 buffer of m slots) and a `shingle_count` (Sketch). With `width` 8, the slots are a
 *     signature's 8-byte values, little-endian (a record without a verifier: records.py's Probe),
 *     none empty (`empty` not read): the Jaccard estimate is the share of equal slots, as
 *     minhash.estimate_jaccard's on the signatures (`chance` 0). For each candidate: the Jaccard
 *     estimate from the verifiers (reference_sketch.py: estimate_jaccard_verified_many, slots
 *     equal to `empty` in both left out, chance agreements taken out) and the containment
 *     estimates derived from it with the distinct counts (estimate_containment_many), as three
 *     bytes objects of native float64, with the same floating-point operations in the same order
 *     (built without contracting them into fused multiply-adds). ValueError when a verifier's
 *     length differs from the query's. A query of no slots (verify_perm=0) scores 0 against
 *     every candidate: minhash.verified_scores and dedup.rank score those from the signatures.
 *
 * rank(query, candidates, size_a, empty, chance, top, threshold, containment[, width]) -> (top, match)
 *     The decision over an article's candidates (dedup.py: _ranked is the reference) in one call,
 *     where numpy took a dozen calls on arrays of tens of items: each candidate scored as `scores`
 *     does, then ordered best first (the higher Jaccard, then the smaller `seq`, then the earlier
 *     in the sequence). top: a list of (index, jaccard, containment, contains) of the first `top`
 *     in that order. match: None, or (kind, index, jaccard, containment, contains): kind 1
 *     (duplicate), the best, when its Jaccard reaches `threshold`; else kind 2 (partial), the
 *     candidate whose max(containment, contains) is highest and reaches `containment` (ties: the
 *     smaller seq, then the earlier), unless `containment` is negative. ValueError as `scores`.
 *
 * merge_buckets(buckets, count) -> list of int
 *     buckets: a sequence of bytes (a stored LSH bucket: 8-byte big-endian arrival numbers in the
 *     order they joined it) or None (no such bucket). The distinct arrival numbers in order of
 *     first appearance, bucket by bucket, at most `count` of them (reference_state.py:
 *     merge_buckets, the reference, merges them with dict.fromkeys, or numpy for a large cluster).
 *
 * varints(data, position, count) -> (values, end)
 *     data: a buffer. The `count` unsigned LEB128 varints from `position` (seven bits a byte, the
 *     low ones first: a record's head; tests/support/reference_state.py: read_varints is the
 *     reference) as a tuple of ints, and the position after the last. ValueError when one runs
 *     past the end of `data` or past 64 bits.
 *
 * count_postings(lists, width, full, need, top) -> list of (int, int)
 *     lists: a sequence of bytes (posting lists: `width`-byte big-endian entries, the top bit of
 *     an entry a flag) or None; those of `full` bytes or more are left out. Counts each distinct
 *     entry over the lists and keeps those counted at least `need` times or flagged; returns at
 *     most `top` of them as (entry without its flag, count), the most counted first, then the
 *     smallest (reference: tests/support/reference_state.py, rank_postings).
 *
 * sign_batch(rows, k, seed_key, num_perm, empty, empty_slot, anchor_k, window, anchor_seed, most)
 *     -> SignBatch
 *     rows: a sequence of (units, signature, verifier, anchors): per text, its uint32 code points
 *     (at least k), the writable buffers finish writes (a verifier as long in every row), and
 *     whether its anchors are wanted. Does what oph_minima (into bins of the batch's own, one a
 *     verifier slot), finish and anchors do for each text, in order, on a thread of its own (the
 *     caller's for one text, or where none can start), holding the buffers until
 *     SignBatch.wait(), which joins it and returns a list of (distinct, unfilled, packed anchors),
 *     one a text, the anchors None where not wanted or the text is shorter than anchor_k: the
 *     pipeline signs one batch while it decides the one before (signing.py: SketchBatch). The
 *     thread touches no Python object.
 *
 * anchors(points, k, window, seed_key, most) -> bytes
 *     points: uint32 code points, at least k of them; window in 1..255. Winnowing
 *     (reference_anchors.py: anchors_of): each k-character shingle's polynomial hash (as oph_minima,
 *     rolled rather than recomputed) mixed by fmix64(h ^ seed_key); of every `window` consecutive
 *     ones the least, the rightmost among equals (the least of all when there are at most
 *     `window`), each chosen position once, ascending, the first `most` of them. Returns them packed
 *     (anchors.py: Anchors): the low 32 bits of each chosen value big-endian, then each position's
 *     offset from the one before (the first's from 0) in a byte, which a window <= 255 bounds.
 *
 * passages(mine, other, k, gap, shift, repeats, limit) -> list of (int, int, int, int, int)
 *     mine, other: packed anchors (as `anchors` returns them). The passages both hold
 *     (reference_anchors.py: passages): anchors of equal hash, each of mine matched with the first
 *     `repeats` of other's in position order, chained while both advance (by at most `gap`, their
 *     advances differing by at most `shift`) in the latest run of their diagonal band
 *     ((other's position - mine's) floor-divided by `shift`) or of a neighbouring one. At most
 *     `limit`, the longest first, then the earliest: (start, last + k, other start, other last + k,
 *     anchors).
 *
 * posting_keys(anchors, prefix) -> list of bytes
 *     anchors: packed anchors. `prefix` followed by each distinct hash's 4 bytes, in the order of
 *     first appearance (reference: tests/support/reference_state.py, posting_keys).
 *
 * join_postings(names, lists, entry, full, into) -> (created, filled)
 *     names: bytes; lists: bytes or None (absent), as many. `entry` appended to each list of fewer
 *     than `full` bytes (an absent one: `entry` alone), set in the dict `into` under its name;
 *     returns how many were absent and how many reach `full` (reference:
 *     tests/support/reference_state.py, join_postings).
 *
 * join_buckets(names, buckets, entry, limit, into, sizes) -> int
 *     names: bytes; buckets: bytes (a stored LSH bucket, whole entries) or None (absent), as many.
 *     `entry` (one member, its width the entries') appended to each bucket, which keeps its last
 *     `limit` bytes (a whole number of entries), set in the dict `into` under its name; the list
 *     `sizes` (buckets by member count) moved from each bucket's count to its new one, extended
 *     as needed; returns how many were absent (reference: tests/support/reference_state.py,
 *     join_buckets).
 *
 * leave_entries(names, stored, entry, masked, full, into, sizes) -> (emptied, unfilled, changed)
 *     names: bytes; stored: bytes (whole entries of `entry`'s width) or None (absent), as many.
 *     Every entry equal to `entry` taken out of each (`masked`: compared without the first byte's
 *     top bit, a posting entry's flag), the rest set in the dict `into` under its name, or None
 *     where none is left; `sizes` (buckets by member count, or None: not counted) moved from each
 *     changed one's count to its new one. Returns how many were emptied, how many held `full`
 *     bytes or more before (0: none counted), and the names changed, in order (reference:
 *     tests/support/reference_state.py, leave_entries; state/tables.py: a bucket or posting list
 *     an article leaves).
 *
 * pack_changes(changes) -> bytes
 *     changes: a dict of bytes keys (at most 255 bytes each) to bytes values or None (deleted).
 *     The count (4 bytes big-endian), each key's length (a byte), each value's (4 bytes big-endian,
 *     0xFFFFFFFF for None), the keys, then the values, in the dict's order (state/held.py: the
 *     log of the held families; tests/support/reference_state.py: pack_changes is the reference).
 *
 * split_changes(changes, prefixes) -> (packed, rest)
 *     changes: a dict; prefixes: bytes, first bytes of keys. The changes whose key is bytes that
 *     starts with one of them, packed as pack_changes packs a dict of them (None when there is
 *     none), and the others, in a new dict, in the order of `changes` (state/held.py: the held
 *     families' log value and the rest of a write batch).
 *
 * HeldTable()
 *     Bytes keys (at most 255 bytes) to bytes values, as a dict of them would hold them, in
 *     open-addressing tables (segments by hash, each doubling by itself, so that growth never
 *     rehashes every entry at once) of entries allocated one each, key and value together: the held
 *     families of state/held.py at a fraction of the memory of a dict of bytes objects (a dict is
 *     the reference in tests/unit/test_held.py). Methods:
 *     get_many(keys) -> list: each key's value, None where absent;
 *     apply(data) -> int: what pack_changes returned, each entry set, a None value deleting its
 *         key (absent already: nothing); returns the number of entries. ValueError, and nothing
 *         applied, when `data` is not exactly one packed dict;
 *     pack_range(step, steps, most) -> list of bytes: the entries whose hash is in the `step`-th
 *         of `steps` equal ranges (a power of two; 0 of 1: every entry), as pack_changes packs
 *         them, in the order of the first 8 bytes of their values (zero-padded), in chunks of at
 *         most `most` bytes of keys and values each (an entry larger alone: a chunk of its own);
 *     reserve(count): slots for `count` entries at once;
 *     items(start, most) -> (list, next): at most `most` (key, value) pairs from position `start`
 *         on (0: the first), and the position to go on from (past the last: every entry was
 *         listed);
 *     len(table): the number of entries.
 *
 * encode_record, verdict_json and decide_fresh come from _decide.c (its comment): an article's
 * record and verdict, and the decision of articles new to the index, which calls the entry
 * points above as they are (_decide.h declares them).
 *
 * Every function checks its arguments before it reads or writes memory: buffer lengths (a whole
 * number of items, non-empty where an item is read, consistent with each other and with the
 * counts), counts and byte values in range; ValueError naming the argument otherwise (TypeError
 * for what is not a buffer or a sequence). Buffers may start at any address (a memoryview slice,
 * np.frombuffer at an offset): their items are read and written through memcpy, never through a
 * cast pointer, which would be undefined behaviour when misaligned. A sequence of candidates is
 * walked holding each candidate and checking the list's length at every step, as reading an
 * attribute can run Python code that changes the list.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_decide.h"

#define POLY 0x9E3779B97F4A7C15ULL

/* Items of Python buffers at any alignment: memcpy of a fixed size compiles to a single move where
 * the target allows unaligned access (x86-64, arm64), so the aligned case costs nothing more. A
 * memcpy store may write anything as far as the compiler knows, though, including the parsed
 * arguments (their address went to PyArg_ParseTuple): the loops that store read copies of those in
 * locals, which would otherwise be loaded again after every store. */
static inline uint64_t get_u64(const void *buf, Py_ssize_t i) {
    uint64_t v;
    memcpy(&v, (const char *)buf + i * 8, 8);
    return v;
}

static inline void put_u64(void *buf, Py_ssize_t i, uint64_t v) { memcpy((char *)buf + i * 8, &v, 8); }

static inline uint32_t get_u32(const void *buf, Py_ssize_t i) {
    uint32_t v;
    memcpy(&v, (const char *)buf + i * 4, 4);
    return v;
}

static inline void put_u32(void *buf, Py_ssize_t i, uint32_t v) { memcpy((char *)buf + i * 4, &v, 4); }

/* Sets ValueError(message) and returns -1: the checks below read as one line each. */
static int invalid(const char *message) {
    PyErr_SetString(PyExc_ValueError, message);
    return -1;
}

static inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDULL;
    k ^= k >> 33;
    k *= 0xC4CEB9FE1A85EC53ULL;
    k ^= k >> 33;
    return k;
}

/* Open-addressing sets of nonzero 64-bit values (count_distinct, merge_buckets): a power of two
 * of at least twice as many slots as values, so that linear probing stays short; 0 marks a free
 * slot. 0 where no such set could be allocated (the doubling would overflow first). */
static size_t set_capacity(Py_ssize_t values) {
    if ((size_t)values > SIZE_MAX / 4 / sizeof(uint64_t)) {
        return 0;
    }
    size_t capacity = 16;
    while (capacity < (size_t)values * 2) {
        capacity <<= 1;
    }
    return capacity;
}

/* Adds `value` (nonzero) to the set, probing from slot `at`: 1 when it was not in it yet. */
static inline int set_add(uint64_t *slots, size_t mask, size_t at, uint64_t value) {
    while (slots[at] != 0 && slots[at] != value) {
        at = (at + 1) & mask;
    }
    if (slots[at] != 0) {
        return 0;
    }
    slots[at] = value;
    return 1;
}

/* Distinct values among `count` well-mixed 64-bit values: a set indexed by their low bits (fmix64
 * output, so no further hashing), zero counted on the side. */
static Py_ssize_t count_distinct(const uint64_t *values, Py_ssize_t count, int *failed) {
    size_t capacity = set_capacity(count);
    uint64_t *slots = capacity ? calloc(capacity, sizeof(uint64_t)) : NULL;
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
        distinct += set_add(slots, mask, (size_t)value & mask, value);
    }
    free(slots);
    return distinct;
}

/* Unit i of a buffer of uint32 (width 4) or uint64 (width 8) items, widened. */
static inline uint64_t unit_at(const void *units, Py_ssize_t width, Py_ssize_t i) {
    return width == 4 ? get_u32(units, i) : get_u64(units, i);
}

/* Each k-unit shingle's value (its polynomial hash, rolled along: the leaving unit's weight
 * POLY**(k-1) taken out and the next unit added, which is exact modulo 2**64, then mixed with the
 * key) into `values`, and the least value of each of `bins` bins into `minima` (aligned, local). */
static void oph_pass(const void *units, Py_ssize_t width, Py_ssize_t k, Py_ssize_t windows, uint64_t key,
                     uint64_t *minima, uint64_t bins, uint64_t *values) {
    uint64_t hash = 0, lead = 1; /* lead: POLY ** (k - 1) */
    for (Py_ssize_t j = 0; j < k; j++) {
        hash = hash * POLY + unit_at(units, width, j);
        lead *= j ? POLY : 1;
    }
    unsigned bins_shift = 0; /* a power of two of bins: the bin's multiply is this shift, to the same bin */
    if (bins > 1 && (bins & (bins - 1)) == 0) {
        bins_shift = 64;
        for (uint64_t rest = bins; rest > 1; rest >>= 1) {
            bins_shift--;
        }
    }
    for (Py_ssize_t i = 0;; i++) {
        uint64_t value = fmix64(hash ^ key);
        uint64_t bin = bins_shift ? value >> bins_shift : ((value >> 32) * bins) >> 32; /* < bins <= 2**16 */
        uint64_t least = minima[bin];
        minima[bin] = value < least ? value : least; /* a store either way: no branch to mispredict */
        values[i] = value;
        if (i + 1 == windows) {
            return;
        }
        hash = (hash - unit_at(units, width, i) * lead) * POLY + unit_at(units, width, i + k);
    }
}

/* oph_minima's work on raw buffers, holding no Python object (sign_batch runs it off the
 * interpreter's thread): `minima` (bins uint64 items, any alignment) updated, the distinct count in
 * `distinct`. -1 when memory ran out (nothing written). */
static int oph_core(const void *units, Py_ssize_t width, Py_ssize_t k, Py_ssize_t windows, uint64_t key,
                    void *minima, Py_ssize_t bins, Py_ssize_t *distinct) {
    uint64_t *values = malloc((size_t)windows * sizeof(uint64_t));
    uint64_t *least = malloc((size_t)bins * sizeof(uint64_t));
    int failed = values == NULL || least == NULL;
    if (!failed) {
        memcpy(least, minima, (size_t)bins * 8);
        oph_pass(units, width, k, windows, key, least, (uint64_t)bins, values);
        *distinct = count_distinct(values, windows, &failed);
        if (!failed) {
            memcpy(minima, least, (size_t)bins * 8);
        }
    }
    free(values);
    free(least);
    return failed ? -1 : 0;
}

/* oph_minima's checks of its buffers: 0 when they hold (else ValueError set, -1). */
static int oph_arguments_invalid(const Py_buffer *units, Py_ssize_t k, const Py_buffer *minima, Py_ssize_t width) {
    return (width != 4 && width != 8 && invalid("width must be 4 (uint32 units) or 8 (uint64 units)")) ||
           (units->len % width && invalid("units must be a whole number of width-byte items")) ||
           (k < 1 && invalid("k must be >= 1")) ||
           (units->len / width < k && invalid("units must hold at least k items")) ||
           (minima->len % 8 && invalid("minima must be uint64 (a multiple of 8 bytes)")) ||
           ((minima->len < 8 || minima->len > 65536 * 8) && invalid("minima must hold 1..65536 bins"));
}

static PyObject *oph_minima(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer units, minima;
    Py_ssize_t k, width = 8, distinct = 0;
    unsigned long long seed_key;
    if (!PyArg_ParseTuple(args, "y*nKw*|n", &units, &k, &seed_key, &minima, &width)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (!oph_arguments_invalid(&units, k, &minima, width)) {
        Py_ssize_t windows = units.len / width - k + 1;
        if (oph_core(units.buf, width, k, windows, (uint64_t)seed_key, minima.buf, minima.len / 8, &distinct) < 0) {
            PyErr_NoMemory();
        } else {
            result = PyLong_FromSsize_t(distinct);
        }
    }
    PyBuffer_Release(&units);
    PyBuffer_Release(&minima);
    return result;
}

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* The first 64 bits (h1) of MurmurHash3_x64_128 of `data` with seed 0 (Austin Appleby's public
 * domain algorithm): the first 8 bytes of mmh3.hash_bytes, read little-endian. */
static uint64_t murmur3_h1(const uint8_t *data, size_t length) {
    const uint64_t c1 = 0x87C37B91114253D5ULL, c2 = 0x4CF5AD432745937FULL;
    uint64_t h1 = 0, h2 = 0;
    size_t blocks = length / 16;
    for (size_t i = 0; i < blocks; i++) {
        uint64_t k1 = load_le64(data + i * 16), k2 = load_le64(data + i * 16 + 8);
        k1 *= c1; k1 = rotl64(k1, 31); k1 *= c2; h1 ^= k1;
        h1 = rotl64(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52DCE729;
        k2 *= c2; k2 = rotl64(k2, 33); k2 *= c1; h2 ^= k2;
        h2 = rotl64(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495AB5;
    }
    const uint8_t *tail = data + blocks * 16;
    size_t rest = length & 15;
    uint64_t k1 = 0, k2 = 0;
    for (size_t i = rest; i > 8; i--) {
        k2 ^= (uint64_t)tail[i - 1] << (8 * (i - 9));
    }
    if (rest > 8) {
        k2 *= c2; k2 = rotl64(k2, 33); k2 *= c1; h2 ^= k2;
    }
    for (size_t i = rest < 8 ? rest : 8; i > 0; i--) {
        k1 ^= (uint64_t)tail[i - 1] << (8 * (i - 1));
    }
    if (rest > 0) {
        k1 *= c1; k1 = rotl64(k1, 31); k1 *= c2; h1 ^= k1;
    }
    h1 ^= (uint64_t)length;
    h2 ^= (uint64_t)length;
    h1 += h2;
    h2 += h1;
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    return h1 + h2;
}

PyObject *band_keys(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer signature;
    Py_ssize_t bands, rows;
    if (!PyArg_ParseTuple(args, "y*nn", &signature, &bands, &rows)) {
        return NULL;
    }
    PyObject *keys = NULL;
    /* rows compared with the slots per band rather than bands * rows with the slots: no product to
     * overflow */
    if (((bands < 0 || bands > 65535) && invalid("bands must be 0..65535 (a 2-byte band index)")) ||
        (rows < 1 && invalid("rows must be >= 1")) ||
        (signature.len % 8 && invalid("signature must be uint64 (a multiple of 8 bytes)")) ||
        (bands > 0 && rows > signature.len / 8 / bands &&
         invalid("signature must hold at least bands * rows slots"))) {
        goto done;
    }
    keys = PyList_New(bands);
    if (keys == NULL) {
        goto done;
    }
    for (Py_ssize_t band = 0; band < bands; band++) {
        uint8_t key[10];
        uint64_t digest = murmur3_h1((const uint8_t *)signature.buf + band * rows * 8, (size_t)(rows * 8));
        key[0] = (uint8_t)(band >> 8);
        key[1] = (uint8_t)band;
        for (int i = 0; i < 8; i++) {
            key[2 + i] = (uint8_t)(digest >> (8 * i));
        }
        PyObject *item = PyBytes_FromStringAndSize((const char *)key, sizeof key);
        if (item == NULL) {
            Py_CLEAR(keys);
            goto done;
        }
        PyList_SET_ITEM(keys, band, item);
    }
done:
    PyBuffer_Release(&signature);
    return keys;
}

static PyObject *collapse_spaces(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer points, table, out;
    if (!PyArg_ParseTuple(args, "y*y*w*", &points, &table, &out)) {
        return NULL;
    }
    PyObject *result = NULL;
    if ((points.len % 4 && invalid("points must be uint32 (a multiple of 4 bytes)")) ||
        (out.len % 4 && invalid("out must be uint32 (a multiple of 4 bytes)")) ||
        (out.len < points.len && invalid("out must be at least as long as points"))) {
        goto done;
    }
    static const uint8_t no_space = 0; /* the table of an empty one: nothing is a space */
    const Py_ssize_t count = points.len / 4, known = table.len ? table.len : 1;
    const void *const point = points.buf;
    void *const written = out.buf;
    /* one byte a code point, any alignment; its first (U+0000) is never a space */
    const uint8_t *const space = table.len ? (const uint8_t *)table.buf : &no_space;
    Py_ssize_t length = 0;
    uint32_t after_space = 1; /* drops leading spaces */
    for (Py_ssize_t i = 0; i < count; i++) {
        /* Branch-free in arithmetic, as spaces are too irregular to predict: written as conditions,
         * a compiler makes them branches. A code point past the table reads its first entry. */
        uint32_t code = get_u32(point, i);
        uint32_t is_space = space[(Py_ssize_t)code < known ? code : 0] != 0;
        put_u32(written, length, code ^ ((code ^ 32u) & (0u - is_space))); /* 32 for a space */
        length += 1 - (is_space & after_space); /* length <= i < count: inside out */
        after_space = is_space;
    }
    if (length > 0 && get_u32(written, length - 1) == 32) {
        length--;
    }
    result = PyLong_FromSsize_t(length);
done:
    PyBuffer_Release(&points);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out);
    return result;
}

/* The Jaccard estimate of two verifiers from their equal slots and, of those, slots empty in both
 * (reference_sketch.py: estimate_jaccard_verified_many, _estimates and _unbias_many, the same
 * operations). */
static double jaccard_estimate(Py_ssize_t equal, Py_ssize_t both_empty, Py_ssize_t size, double chance) {
    if (equal == 0) {
        return 0.0;
    }
    Py_ssize_t usable = size - both_empty;
    double agreement = usable != 0 ? (double)(equal - both_empty) / (double)usable : 1.0;
    double estimate = (agreement - chance) / (1.0 - chance);
    return estimate > 0.0 ? estimate : 0.0;
}

/* Attribute names of the candidates rank() and scores() read, made once (module init), so that no
 * read of an attribute builds its name from a C string again. */
static PyObject *name_verifier, *name_shingle_count, *name_seq;

static int write_scores(PyObject *candidate, const uint8_t *mine, Py_ssize_t size, Py_ssize_t width, Py_ssize_t size_a,
                        int empty, double chance, double *jaccard, double *inside, double *contains) {
    PyObject *verifier = PyObject_GetAttr(candidate, name_verifier);
    if (verifier == NULL) {
        return -1;
    }
    PyObject *count = PyObject_GetAttr(candidate, name_shingle_count);
    if (count == NULL) {
        Py_DECREF(verifier);
        return -1;
    }
    Py_ssize_t size_b = PyLong_AsSsize_t(count);
    Py_DECREF(count);
    if ((size_b == -1 && PyErr_Occurred()) ||
        /* size_a + size_b below must not overflow (size_a >= 0, checked by the caller) */
        ((size_b < 0 || size_b > PY_SSIZE_T_MAX - size_a) &&
         invalid("a candidate's shingle_count must be >= 0, and with size_a fit in a Py_ssize_t"))) {
        Py_DECREF(verifier);
        return -1;
    }
    Py_buffer theirs;
    int status = PyObject_GetBuffer(verifier, &theirs, PyBUF_SIMPLE);
    Py_DECREF(verifier);
    if (status < 0) {
        return -1;
    }
    if (theirs.len != size) {
        PyBuffer_Release(&theirs);
        return invalid("a candidate's verifier differs in length from query");
    }
    const uint8_t *slot = (const uint8_t *)theirs.buf;
    Py_ssize_t equal = 0, both_empty = 0;
    if (width == 1) {
        for (Py_ssize_t i = 0; i < size; i++) { /* branch-free: the compiler vectorises it */
            int same = mine[i] == slot[i];
            equal += same;
            both_empty += same & (mine[i] == (uint8_t)empty);
        }
    } else { /* a signature's slots: none is empty */
        for (Py_ssize_t i = 0; i < size; i += width) {
            equal += memcmp(mine + i, slot + i, (size_t)width) == 0;
        }
    }
    PyBuffer_Release(&theirs);
    double j = jaccard_estimate(equal, both_empty, size / width, chance);
    *jaccard = j;
    *inside = 0.0;
    *contains = 0.0;
    if (size_a > 0 && size_b > 0) { /* estimate_containment_many: |A∩B| = J(|A|+|B|)/(1+J) */
        double intersection = j * (double)(size_a + size_b) / (1.0 + j);
        double a = intersection / (double)size_a, b = intersection / (double)size_b;
        *inside = a < 1.0 ? a : 1.0;
        *contains = b < 1.0 ? b : 1.0;
    }
    return 0;
}

/* scores' and rank's common arguments: nonzero (ValueError or TypeError set) when one is out of
 * range. */
static int scoring_arguments_invalid(PyObject *others, Py_ssize_t size, Py_ssize_t width, Py_ssize_t size_a, int empty,
                                     double chance) {
    if (!PySequence_Check(others)) {
        PyErr_SetString(PyExc_TypeError, "others must be a sequence");
        return -1;
    }
    if (((width != 1 && width != 8) && invalid("width must be 1 or 8")) ||
        (size % width != 0 && invalid("the query must be a whole number of slots")) ||
        (size_a < 0 && invalid("size_a must be >= 0")) ||
        ((empty < 0 || empty > 255) && invalid("empty must be a byte value, 0..255")) ||
        /* chance 1 or more divides by zero or flips the sign of the estimates; NaN fails both */
        (!(chance >= 0.0 && chance < 1.0) && invalid("chance must be in [0, 1)"))) {
        return -1;
    }
    return 0;
}

/* Candidate `row` of `sequence` (from PySequence_Fast) as a new reference, or NULL (RuntimeError)
 * when the list has become shorter. Reading a candidate's attributes can run Python code, which
 * could shrink the list being walked, or drop the last reference to the candidate being read. */
static PyObject *candidate_at(PyObject *sequence, Py_ssize_t row) {
    if (row >= PySequence_Fast_GET_SIZE(sequence)) {
        PyErr_SetString(PyExc_RuntimeError, "others changed size during the call");
        return NULL;
    }
    return Py_NewRef(PySequence_Fast_GET_ITEM(sequence, row));
}

PyObject *scores(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer query;
    PyObject *others;
    Py_ssize_t size_a, width = 1;
    int empty;
    double chance;
    if (!PyArg_ParseTuple(args, "y*Onid|n", &query, &others, &size_a, &empty, &chance, &width)) {
        return NULL;
    }
    PyObject *result = NULL, *jaccard = NULL, *inside = NULL, *contains = NULL;
    PyObject *sequence = NULL;
    if (scoring_arguments_invalid(others, query.len, width, size_a, empty, chance) ||
        (sequence = PySequence_Fast(others, "others must be a sequence")) == NULL) {
        goto done;
    }
    Py_ssize_t rows = PySequence_Fast_GET_SIZE(sequence);
    jaccard = PyBytes_FromStringAndSize(NULL, rows * (Py_ssize_t)sizeof(double));
    inside = PyBytes_FromStringAndSize(NULL, rows * (Py_ssize_t)sizeof(double));
    contains = PyBytes_FromStringAndSize(NULL, rows * (Py_ssize_t)sizeof(double));
    if (jaccard == NULL || inside == NULL || contains == NULL) {
        goto done;
    }
    for (Py_ssize_t row = 0; row < rows; row++) {
        double j, a, b;
        PyObject *candidate = candidate_at(sequence, row);
        if (candidate == NULL) {
            goto done;
        }
        int status = write_scores(candidate, (const uint8_t *)query.buf, query.len, width, size_a, empty, chance, &j, &a, &b);
        Py_DECREF(candidate);
        if (status < 0) {
            goto done;
        }
        memcpy(PyBytes_AS_STRING(jaccard) + row * sizeof(double), &j, sizeof(double));
        memcpy(PyBytes_AS_STRING(inside) + row * sizeof(double), &a, sizeof(double));
        memcpy(PyBytes_AS_STRING(contains) + row * sizeof(double), &b, sizeof(double));
    }
    result = PyTuple_Pack(3, jaccard, inside, contains);
done:
    Py_XDECREF(jaccard);
    Py_XDECREF(inside);
    Py_XDECREF(contains);
    Py_XDECREF(sequence);
    PyBuffer_Release(&query);
    return result;
}

typedef struct {
    double jaccard, inside, contains;
    long long seq;
    Py_ssize_t index;
} Scored;

/* Best first: the higher Jaccard, then the earlier arrival, then the earlier in the sequence. */
static int best_first(const void *left, const void *right) {
    const Scored *a = (const Scored *)left, *b = (const Scored *)right;
    if (a->jaccard != b->jaccard) {
        return a->jaccard > b->jaccard ? -1 : 1;
    }
    if (a->seq != b->seq) {
        return a->seq < b->seq ? -1 : 1;
    }
    return (a->index > b->index) - (a->index < b->index);
}

static int read_seq(PyObject *candidate, long long *seq) {
    PyObject *value = PyObject_GetAttr(candidate, name_seq);
    if (value == NULL) {
        return -1;
    }
    *seq = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return (*seq == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* The partial pick: the highest max(containment, contains) reaching `containment`, ties to the
 * earlier arrival, then to the earlier in the sequence (-1: none). */
static Py_ssize_t partial_pick(const Scored *scored, Py_ssize_t rows, double containment) {
    Py_ssize_t pick = -1;
    double best = 0.0;
    for (Py_ssize_t row = 0; row < rows; row++) {
        const Scored *entry = &scored[row];
        double reach = entry->inside > entry->contains ? entry->inside : entry->contains;
        if (reach >= containment &&
            (pick < 0 || reach > best || (reach == best && entry->seq < scored[pick].seq))) {
            pick = row;
            best = reach;
        }
    }
    return pick;
}

PyObject *rank(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer query;
    PyObject *others;
    Py_ssize_t size_a, top, width = 1;
    int empty;
    double chance, threshold, containment;
    if (!PyArg_ParseTuple(args, "y*Onidndd|n", &query, &others, &size_a, &empty, &chance, &top, &threshold,
                          &containment, &width)) {
        return NULL;
    }
    PyObject *result = NULL, *listed = NULL, *match = NULL, *sequence = NULL;
    Scored *scored = NULL;
    if (scoring_arguments_invalid(others, query.len, width, size_a, empty, chance) || (top < 0 && invalid("top must be >= 0")) ||
        (sequence = PySequence_Fast(others, "others must be a sequence")) == NULL) {
        goto done;
    }
    Py_ssize_t rows = PySequence_Fast_GET_SIZE(sequence);
    scored = PyMem_Malloc((size_t)(rows > 0 ? rows : 1) * sizeof(Scored));
    if (scored == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t row = 0; row < rows; row++) {
        PyObject *candidate = candidate_at(sequence, row);
        if (candidate == NULL) {
            goto done;
        }
        Scored *entry = &scored[row];
        entry->index = row;
        int status = write_scores(candidate, (const uint8_t *)query.buf, query.len, width, size_a, empty, chance,
                                  &entry->jaccard, &entry->inside, &entry->contains);
        if (status == 0) {
            status = read_seq(candidate, &entry->seq);
        }
        Py_DECREF(candidate);
        if (status < 0) {
            goto done;
        }
    }
    Py_ssize_t pick = containment >= 0.0 ? partial_pick(scored, rows, containment) : -1;
    Scored partial = pick >= 0 ? scored[pick] : (Scored){0};
    qsort(scored, (size_t)rows, sizeof(Scored), best_first);
    Py_ssize_t kept = top < rows ? top : rows;
    listed = PyList_New(kept);
    if (listed == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < kept; i++) {
        const Scored *entry = &scored[i];
        PyObject *item = Py_BuildValue("(nddd)", entry->index, entry->jaccard, entry->inside, entry->contains);
        if (item == NULL) {
            goto done;
        }
        PyList_SET_ITEM(listed, i, item);
    }
    if (rows > 0 && scored[0].jaccard >= threshold) { /* the best is a duplicate whenever any is */
        const Scored *best = &scored[0];
        match = Py_BuildValue("(inddd)", 1, best->index, best->jaccard, best->inside, best->contains);
    } else if (pick >= 0) {
        match = Py_BuildValue("(inddd)", 2, partial.index, partial.jaccard, partial.inside, partial.contains);
    } else {
        match = Py_NewRef(Py_None);
    }
    if (match != NULL) {
        result = PyTuple_Pack(2, listed, match);
    }
done:
    Py_XDECREF(listed);
    Py_XDECREF(match);
    Py_XDECREF(sequence);
    PyMem_Free(scored);
    PyBuffer_Release(&query);
    return result;
}

PyObject *merge_buckets(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buckets;
    Py_ssize_t wanted;
    if (!PyArg_ParseTuple(args, "On", &buckets, &wanted)) {
        return NULL;
    }
    if (!PySequence_Check(buckets)) {
        PyErr_SetString(PyExc_TypeError, "buckets must be a sequence");
        return NULL;
    }
    if (wanted < 0) {
        invalid("count must be >= 0");
        return NULL;
    }
    /* The result list first: making it can start a garbage collection, whose finalizers could
     * change a list of buckets. From PySequence_Fast on, no Python code runs (ints and a list's
     * growth are not tracked by the collector), so a list is read in place, sized in one pass and
     * merged in the next, without a copy. */
    PyObject *merged = PyList_New(0);
    if (merged == NULL) {
        return NULL;
    }
    PyObject *sequence = PySequence_Fast(buckets, "buckets must be a sequence");
    if (sequence == NULL) {
        Py_DECREF(merged);
        return NULL;
    }
    uint64_t *seen = NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence), total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *stored = PySequence_Fast_GET_ITEM(sequence, i);
        if (stored == Py_None) {
            continue;
        }
        if (!PyBytes_Check(stored) || PyBytes_GET_SIZE(stored) % 8 != 0) {
            invalid("each of buckets must be bytes of 8-byte arrival numbers, or None");
            Py_CLEAR(merged);
            goto done;
        }
        Py_ssize_t members = PyBytes_GET_SIZE(stored) / 8; /* the same bytes may repeat: saturate */
        total = members > PY_SSIZE_T_MAX - total ? PY_SSIZE_T_MAX : total + members;
    }
    size_t capacity = set_capacity(total);
    /* arrival number + 1, as 0 marks a free slot */
    seen = capacity ? PyMem_Calloc(capacity, sizeof(uint64_t)) : NULL;
    if (seen == NULL) {
        PyErr_NoMemory();
        Py_CLEAR(merged);
        goto done;
    }
    size_t mask = capacity - 1;
    for (Py_ssize_t i = 0; i < count && PyList_GET_SIZE(merged) < wanted; i++) {
        PyObject *stored = PySequence_Fast_GET_ITEM(sequence, i);
        if (stored == Py_None) {
            continue;
        }
        const uint8_t *bytes = (const uint8_t *)PyBytes_AS_STRING(stored);
        Py_ssize_t members = PyBytes_GET_SIZE(stored) / 8;
        for (Py_ssize_t m = 0; m < members && PyList_GET_SIZE(merged) < wanted; m++) {
            uint64_t seq = 0;
            for (int b = 0; b < 8; b++) {
                seq = (seq << 8) | bytes[m * 8 + b];
            }
            if (!set_add(seen, mask, (size_t)fmix64(seq) & mask, seq + 1)) {
                continue; /* in an earlier bucket already */
            }
            PyObject *number = PyLong_FromUnsignedLongLong(seq);
            if (number == NULL || PyList_Append(merged, number) < 0) {
                Py_XDECREF(number);
                Py_CLEAR(merged);
                goto done;
            }
            Py_DECREF(number);
        }
    }
done:
    PyMem_Free(seen);
    Py_DECREF(sequence);
    return merged;
}

typedef struct {
    uint64_t entry;
    uint64_t count;
} Counted;

/* The most counted first, then the smallest entry. */
static int by_count(const void *a, const void *b) {
    const Counted *x = a, *y = b;
    if (x->count != y->count) {
        return x->count > y->count ? -1 : 1;
    }
    return (x->entry > y->entry) - (x->entry < y->entry);
}

PyObject *count_postings(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *lists;
    Py_ssize_t width, full, need, top;
    if (!PyArg_ParseTuple(args, "Onnnn", &lists, &width, &full, &need, &top)) {
        return NULL;
    }
    if ((width < 1 || width > 8) && invalid("width must be in 1..8")) {
        return NULL;
    }
    if ((need < 0 || top < 0) && invalid("need and top must be >= 0")) {
        return NULL;
    }
    /* made before the lists are read in place: see merge_buckets */
    PyObject *result = PyList_New(0);
    if (result == NULL) {
        return NULL;
    }
    PyObject *sequence = PySequence_Fast(lists, "lists must be a sequence");
    if (sequence == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    uint64_t *slots = NULL, *counts = NULL;
    Counted *kept = NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence), total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *stored = PySequence_Fast_GET_ITEM(sequence, i);
        if (stored == Py_None) {
            continue;
        }
        if (!PyBytes_Check(stored) || PyBytes_GET_SIZE(stored) % width != 0) {
            invalid("each of lists must be bytes of whole entries, or None");
            Py_CLEAR(result);
            goto done;
        }
        if (PyBytes_GET_SIZE(stored) < full) {
            Py_ssize_t entries = PyBytes_GET_SIZE(stored) / width;
            total = entries > PY_SSIZE_T_MAX - total ? PY_SSIZE_T_MAX : total + entries;
        }
    }
    size_t capacity = set_capacity(total);
    slots = capacity ? PyMem_Calloc(capacity, sizeof(uint64_t)) : NULL; /* entry + 1; 0: free */
    counts = capacity ? PyMem_Calloc(capacity, sizeof(uint64_t)) : NULL;
    kept = capacity ? PyMem_Calloc(capacity, sizeof(Counted)) : NULL;
    if (slots == NULL || counts == NULL || kept == NULL) {
        PyErr_NoMemory();
        Py_CLEAR(result);
        goto done;
    }
    size_t mask = capacity - 1;
    const uint64_t flag = (uint64_t)1 << (8 * width - 1);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *stored = PySequence_Fast_GET_ITEM(sequence, i);
        if (stored == Py_None || PyBytes_GET_SIZE(stored) >= full) {
            continue;
        }
        const uint8_t *bytes = (const uint8_t *)PyBytes_AS_STRING(stored);
        Py_ssize_t entries = PyBytes_GET_SIZE(stored) / width;
        for (Py_ssize_t m = 0; m < entries; m++) {
            uint64_t entry = 0;
            for (Py_ssize_t b = 0; b < width; b++) {
                entry = (entry << 8) | bytes[m * width + b];
            }
            size_t at = (size_t)fmix64(entry) & mask;
            while (slots[at] != 0 && slots[at] != entry + 1) {
                at = (at + 1) & mask;
            }
            slots[at] = entry + 1;
            counts[at]++;
        }
    }
    size_t many = 0;
    for (size_t at = 0; at < capacity; at++) {
        if (slots[at] != 0 && (counts[at] >= (uint64_t)need || ((slots[at] - 1) & flag))) {
            kept[many].entry = (slots[at] - 1) & ~flag;
            kept[many].count = counts[at];
            many++;
        }
    }
    qsort(kept, many, sizeof(Counted), by_count);
    for (size_t i = 0; i < many && (Py_ssize_t)i < top; i++) {
        PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)kept[i].entry, (unsigned long long)kept[i].count);
        if (pair == NULL || PyList_Append(result, pair) < 0) {
            Py_XDECREF(pair);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(pair);
    }
done:
    PyMem_Free(slots);
    PyMem_Free(counts);
    PyMem_Free(kept);
    Py_DECREF(sequence);
    return result;
}

/* finish's work on raw buffers (any alignment), holding no Python object: returns the signature
 * slots left empty. */
static Py_ssize_t finish_core(const void *minima, Py_ssize_t slots, Py_ssize_t num_perm, uint64_t vacant,
                              uint8_t vacant_slot, void *out, uint8_t *narrow) {
    const Py_ssize_t group = slots / num_perm;
    const uint8_t stand_in = (uint8_t)(vacant_slot - 1);
    Py_ssize_t unfilled = 0;
    for (Py_ssize_t slot = 0; slot < num_perm; slot++) {
        uint64_t least = get_u64(minima, slot * group);
        for (Py_ssize_t i = 1; i < group; i++) {
            uint64_t value = get_u64(minima, slot * group + i);
            least = value < least ? value : least;
        }
        put_u64(out, slot, least);
        unfilled += least == vacant;
    }
    for (Py_ssize_t i = 0; i < slots; i++) {
        uint64_t minimum = get_u64(minima, i);
        uint8_t low = (uint8_t)minimum;
        /* a real minimum whose low bits read as the empty slot is never taken for empty */
        narrow[i] = (low == vacant_slot && minimum != vacant) ? stand_in : low;
    }
    return unfilled;
}

/* finish's checks of its buffers: 0 when they hold (else ValueError set). num_perm <= the bins
 * before num_perm * 8 is formed: no product to overflow, and every group holds one bin at least,
 * the first of which is read unconditionally. */
static int finish_arguments_invalid(const Py_buffer *wide, Py_ssize_t num_perm, int empty_slot,
                                    const Py_buffer *signature, const Py_buffer *verifier) {
    return (num_perm < 1 && invalid("num_perm must be >= 1")) ||
           (wide->len % 8 && invalid("wide must be uint64 (a multiple of 8 bytes)")) ||
           ((wide->len / 8 < num_perm || (wide->len / 8) % num_perm) &&
            invalid("wide must hold a nonzero multiple of num_perm bins")) ||
           (signature->len != num_perm * 8 && invalid("signature must be num_perm uint64 slots")) ||
           (verifier->len != wide->len / 8 && invalid("verifier must be one byte per bin of wide")) ||
           ((empty_slot < 0 || empty_slot > 255) && invalid("empty_slot must be a byte value, 0..255"));
}

static PyObject *finish(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer wide, signature, verifier;
    Py_ssize_t num_perm;
    unsigned long long empty;
    int empty_slot;
    if (!PyArg_ParseTuple(args, "y*nKiw*w*", &wide, &num_perm, &empty, &empty_slot, &signature, &verifier)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (!finish_arguments_invalid(&wide, num_perm, empty_slot, &signature, &verifier)) {
        result = PyLong_FromSsize_t(finish_core(wide.buf, wide.len / 8, num_perm, (uint64_t)empty,
                                                (uint8_t)empty_slot, signature.buf, (uint8_t *)verifier.buf));
    }
    PyBuffer_Release(&wide);
    PyBuffer_Release(&signature);
    PyBuffer_Release(&verifier);
    return result;
}

const char *varint_at(const uint8_t *data, Py_ssize_t len, Py_ssize_t *at, uint64_t *out) {
    uint64_t value = 0;
    int shift = 0;
    uint8_t byte;
    do {
        if (*at >= len) {
            return "a varint runs past the end of data";
        }
        if (shift > 63) {
            return "a varint runs past 64 bits";
        }
        byte = data[(*at)++];
        value |= (uint64_t)(byte & 0x7F) << shift;
        shift += 7;
    } while (byte & 0x80);
    *out = value;
    return NULL;
}

static PyObject *varints(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    Py_ssize_t position, count;
    if (!PyArg_ParseTuple(args, "y*nn", &data, &position, &count)) {
        return NULL;
    }
    PyObject *values = NULL, *result = NULL;
    if (((position < 0 || position > data.len) && invalid("position must be within data")) ||
        ((count < 0 || count > data.len - position) && invalid("count must be 0..the bytes after position"))) {
        goto done;
    }
    values = PyTuple_New(count);
    if (values == NULL) {
        goto done;
    }
    const uint8_t *bytes = (const uint8_t *)data.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t value;
        const char *problem = varint_at(bytes, data.len, &position, &value);
        if (problem != NULL) {
            invalid(problem);
            goto done;
        }
        PyObject *item = PyLong_FromUnsignedLongLong(value);
        if (item == NULL) {
            goto done;
        }
        PyTuple_SET_ITEM(values, i, item);
    }
    result = Py_BuildValue("(On)", values, position);
done:
    Py_XDECREF(values);
    PyBuffer_Release(&data);
    return result;
}

/* The position of the least of values[from..to] (inclusive), the rightmost among equals. */
static Py_ssize_t least_of(const uint64_t *values, Py_ssize_t from, Py_ssize_t to) {
    Py_ssize_t least = from;
    for (Py_ssize_t i = from + 1; i <= to; i++) {
        if (values[i] <= values[least]) {
            least = i;
        }
    }
    return least;
}

/* Winnowing by blocks of `window` values: in each block the least from each place to the block's
 * end (`after`) and from the block's start to each place (`before`), the rightmost among equals;
 * a window [s, s + window) is one block's `before` at its last place, or the `after` of s in its
 * block and the `before` of its last place in the next, the right one on a tie. Straight passes
 * with no data-dependent loop, where a queue of candidates pops an unpredictable number of them
 * at each place. Writes the chosen positions, each once, ascending, at most `most`. */
static Py_ssize_t winnow(const uint64_t *values, Py_ssize_t count, Py_ssize_t window, uint32_t *after,
                         uint32_t *before, uint32_t *chosen, Py_ssize_t most) {
    if (count <= window) {
        chosen[0] = (uint32_t)least_of(values, 0, count - 1);
        return most > 0 ? 1 : 0;
    }
    for (Py_ssize_t start = 0; start < count; start += window) {
        Py_ssize_t end = start + window < count ? start + window - 1 : count - 1;
        Py_ssize_t least = end;
        for (Py_ssize_t i = end; i >= start; i--) {
            least = values[i] < values[least] ? i : least; /* an equal one to the right stays */
            after[i] = (uint32_t)least;
        }
        least = start;
        for (Py_ssize_t i = start; i <= end; i++) {
            least = values[i] <= values[least] ? i : least;
            before[i] = (uint32_t)least;
        }
    }
    Py_ssize_t written = 0;
    int64_t last = -1;
    for (Py_ssize_t s = 0; s + window <= count && written < most; s++) {
        uint32_t right = before[s + window - 1], pick = right;
        if (s % window) {
            uint32_t left = after[s];
            pick = values[right] <= values[left] ? right : left;
        }
        if ((int64_t)pick != last) {
            last = pick;
            chosen[written++] = pick;
        }
    }
    return written;
}

/* The most bytes `anchors` packs for `count` code points: five a chosen position, at most one a
 * window and at most `most`. */
static Py_ssize_t anchors_room(Py_ssize_t count, Py_ssize_t k, Py_ssize_t most) {
    Py_ssize_t windows = count - k + 1;
    return 5 * (windows < most ? windows : most);
}

/* anchors' work on raw buffers, holding no Python object (sign_batch runs it off the
 * interpreter's thread): the packed anchors into `out` (anchors_room bytes), their count returned;
 * -1 when memory ran out. */
static Py_ssize_t anchors_core(const void *points, Py_ssize_t count, Py_ssize_t k, Py_ssize_t window, uint64_t key,
                               Py_ssize_t most, uint8_t *out) {
    Py_ssize_t windows = count - k + 1, written = -1;
    uint64_t *values = malloc((size_t)windows * sizeof(uint64_t));
    uint32_t *after = malloc((size_t)windows * sizeof(uint32_t));
    uint32_t *before = malloc((size_t)windows * sizeof(uint32_t));
    uint32_t *chosen = malloc((size_t)windows * sizeof(uint32_t));
    if (values != NULL && after != NULL && before != NULL && chosen != NULL) {
        uint64_t lead = 1; /* POLY ** (k - 1): the weight of the unit that leaves a rolled window */
        uint64_t hash = 0;
        for (Py_ssize_t j = 0; j < k; j++) {
            hash = hash * POLY + get_u32(points, j);
            if (j) {
                lead *= POLY;
            }
        }
        values[0] = fmix64(hash ^ key);
        for (Py_ssize_t i = 1; i < windows; i++) {
            hash = (hash - (uint64_t)get_u32(points, i - 1) * lead) * POLY + get_u32(points, i + k - 1);
            values[i] = fmix64(hash ^ key);
        }
        written = winnow(values, windows, window, after, before, chosen, most);
        /* packed: the hashes big-endian, then the offsets (a window <= 255 keeps each within a byte) */
        uint32_t previous = 0;
        for (Py_ssize_t i = 0; i < written; i++) {
            uint32_t low = (uint32_t)(values[chosen[i]] & 0xFFFFFFFFu);
            out[4 * i] = (uint8_t)(low >> 24);
            out[4 * i + 1] = (uint8_t)(low >> 16);
            out[4 * i + 2] = (uint8_t)(low >> 8);
            out[4 * i + 3] = (uint8_t)low;
            out[4 * written + i] = (uint8_t)(chosen[i] - previous);
            previous = chosen[i];
        }
    }
    free(values);
    free(after);
    free(before);
    free(chosen);
    return written;
}

/* anchors' checks: 0 when they hold (else ValueError set). */
static int anchors_arguments_invalid(const Py_buffer *points, Py_ssize_t k, Py_ssize_t window, Py_ssize_t most) {
    Py_ssize_t count = points->len / 4;
    return (points->len % 4 && invalid("points must be uint32 (a multiple of 4 bytes)")) ||
           ((k < 1 || k > 64) && invalid("k must be in 1..64")) ||
           ((window < 1 || window > 255) && invalid("window must be in 1..255 (a packed offset is a byte)")) ||
           (most < 0 && invalid("most must be >= 0")) || (count < k && invalid("points must hold at least k items")) ||
           (count > UINT32_MAX && invalid("points must hold fewer than 2**32 items"));
}

static PyObject *anchors(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer points;
    Py_ssize_t k, window, most;
    unsigned long long seed_key;
    if (!PyArg_ParseTuple(args, "y*nnKn", &points, &k, &window, &seed_key, &most)) {
        return NULL;
    }
    PyObject *result = NULL;
    uint8_t *out = NULL;
    if (!anchors_arguments_invalid(&points, k, window, most)) {
        Py_ssize_t room = anchors_room(points.len / 4, k, most);
        out = malloc(room ? (size_t)room : 1);
        Py_ssize_t written = out == NULL ? -1 : anchors_core(points.buf, points.len / 4, k, window, seed_key, most, out);
        result = written < 0 ? PyErr_NoMemory() : PyBytes_FromStringAndSize((const char *)out, 5 * written);
    }
    free(out);
    PyBuffer_Release(&points);
    return result;
}

/* One text of a signing batch: its buffers, held from sign_batch until the batch is waited for,
 * and what the work on it returned (its anchors packed into memory of its own). */
typedef struct {
    Py_buffer units, signature, verifier;
    int wants_anchors;
    uint8_t *anchors;
    Py_ssize_t distinct, unfilled, anchor_count;
} SignTask;

typedef struct {
    PyObject_HEAD
    SignTask *tasks;
    Py_ssize_t count, k, num_perm, bins, anchor_k, window, most;
    uint64_t seed_key, empty, anchor_seed;
    uint8_t empty_slot;
    pthread_t thread;
    int running; /* a thread to join */
    int failed;  /* memory ran out in a task */
} SignBatch;

/* The batch's work, on its thread or the caller's: no Python object is touched. The bin minima
 * of one text at a time, in memory of the batch's own. */
static void *sign_tasks(void *arg) {
    SignBatch *b = (SignBatch *)arg;
    uint64_t *minima = b->count ? malloc((size_t)b->bins * sizeof(uint64_t)) : NULL;
    b->failed = b->count && minima == NULL;
    for (Py_ssize_t i = 0; i < b->count && !b->failed; i++) {
        SignTask *t = &b->tasks[i];
        Py_ssize_t units = t->units.len / 4;
        for (Py_ssize_t bin = 0; bin < b->bins; bin++) {
            minima[bin] = b->empty;
        }
        if (oph_core(t->units.buf, 4, b->k, units - b->k + 1, b->seed_key, minima, b->bins, &t->distinct) < 0) {
            b->failed = 1;
            break;
        }
        t->unfilled = finish_core(minima, b->bins, b->num_perm, b->empty, b->empty_slot, t->signature.buf,
                                  (uint8_t *)t->verifier.buf);
        if (t->wants_anchors && units >= b->anchor_k) {
            t->anchors = malloc((size_t)anchors_room(units, b->anchor_k, b->most) + 1);
            t->anchor_count = t->anchors == NULL ? -1
                                                 : anchors_core(t->units.buf, units, b->anchor_k, b->window,
                                                                b->anchor_seed, b->most, t->anchors);
            b->failed |= t->anchor_count < 0;
        }
    }
    free(minima);
    return NULL;
}

static void sign_batch_release(SignBatch *b) {
    if (b->running) {
        Py_BEGIN_ALLOW_THREADS pthread_join(b->thread, NULL);
        Py_END_ALLOW_THREADS b->running = 0;
    }
    for (Py_ssize_t i = 0; i < b->count; i++) {
        SignTask *t = &b->tasks[i];
        PyBuffer_Release(&t->units);
        PyBuffer_Release(&t->signature);
        PyBuffer_Release(&t->verifier);
        free(t->anchors);
    }
    PyMem_Free(b->tasks);
    b->tasks = NULL;
    b->count = 0;
}

static void sign_batch_dealloc(SignBatch *b) {
    sign_batch_release(b);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static PyObject *sign_batch_wait(SignBatch *b, PyObject *unused) {
    (void)unused;
    if (b->tasks == NULL) {
        return invalid("the batch was waited for already"), NULL;
    }
    if (b->running) {
        Py_BEGIN_ALLOW_THREADS pthread_join(b->thread, NULL);
        Py_END_ALLOW_THREADS b->running = 0;
    }
    PyObject *result = b->failed ? PyErr_NoMemory() : PyList_New(b->count);
    for (Py_ssize_t i = 0; result != NULL && i < b->count; i++) {
        SignTask *t = &b->tasks[i];
        PyObject *item = t->anchors == NULL
                             ? Py_BuildValue("(nnO)", t->distinct, t->unfilled, Py_None)
                             : Py_BuildValue("(nny#)", t->distinct, t->unfilled, (const char *)t->anchors,
                                             5 * t->anchor_count);
        if (item == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, i, item);
    }
    sign_batch_release(b);
    return result;
}

static PyMethodDef sign_batch_methods[] = {
    {"wait", (PyCFunction)sign_batch_wait, METH_NOARGS,
     "The batch's work done: a list of (distinct, unfilled, packed anchors or None), one a text."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SignBatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "neardup.core._sketch.SignBatch",
    .tp_basicsize = sizeof(SignBatch),
    .tp_dealloc = (destructor)sign_batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A signing batch under way on a thread of its own (sign_batch).",
    .tp_methods = sign_batch_methods,
};

/* One text's buffers taken from its tuple and checked as oph_minima and finish check theirs: 0,
 * or -1 with an exception set (the buffers taken so far stay in the task, released with the
 * batch). */
static int sign_task_of(SignBatch *b, PyObject *row, SignTask *t) {
    if (!PyArg_ParseTuple(row, "y*w*w*p", &t->units, &t->signature, &t->verifier, &t->wants_anchors)) {
        return -1;
    }
    Py_buffer minima = {.len = t->verifier.len * 8}; /* the batch's, one uint64 a verifier slot */
    if (b->bins == 0) {
        b->bins = t->verifier.len;
    }
    if ((t->verifier.len != b->bins && invalid("verifier must be as long in every row")) ||
        oph_arguments_invalid(&t->units, b->k, &minima, 4) ||
        finish_arguments_invalid(&minima, b->num_perm, b->empty_slot, &t->signature, &t->verifier)) {
        return -1;
    }
    return 0;
}

static PyObject *sign_batch(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *rows;
    Py_ssize_t k, num_perm, anchor_k, window, most;
    unsigned long long seed_key, empty, anchor_seed;
    int empty_slot;
    if (!PyArg_ParseTuple(args, "OnKnKinnKn", &rows, &k, &seed_key, &num_perm, &empty, &empty_slot, &anchor_k,
                          &window, &anchor_seed, &most)) {
        return NULL;
    }
    if (((anchor_k < 1 || anchor_k > 64) && invalid("anchor_k must be in 1..64")) ||
        ((window < 1 || window > 255) && invalid("window must be in 1..255 (a packed offset is a byte)")) ||
        (most < 0 && invalid("most must be >= 0")) ||
        ((empty_slot < 0 || empty_slot > 255) && invalid("empty_slot must be a byte value, 0..255"))) {
        return NULL;
    }
    PyObject *sequence = PySequence_Fast(rows, "rows must be a sequence");
    if (sequence == NULL) {
        return NULL;
    }
    SignBatch *b = PyObject_New(SignBatch, &SignBatchType);
    if (b == NULL) {
        Py_DECREF(sequence);
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
    b->tasks = PyMem_Calloc(count ? (size_t)count : 1, sizeof(SignTask));
    b->count = b->bins = 0;
    b->k = k, b->num_perm = num_perm, b->anchor_k = anchor_k, b->window = window, b->most = most;
    b->seed_key = seed_key, b->empty = empty, b->anchor_seed = anchor_seed, b->empty_slot = (uint8_t)empty_slot;
    b->running = b->failed = 0;
    if (b->tasks == NULL) {
        Py_DECREF(sequence);
        Py_DECREF(b);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        /* counted before its buffers are taken: a failure releases what this one took too */
        b->count = i + 1;
        if (sign_task_of(b, PySequence_Fast_GET_ITEM(sequence, i), &b->tasks[i]) < 0) {
            Py_DECREF(sequence);
            Py_DECREF(b);
            return NULL;
        }
    }
    Py_DECREF(sequence);
    /* the caller's thread does the work of one text (a thread's start would cost more than it can
     * overlap), and where no thread can be started: the same results, later */
    if (count > 1 && pthread_create(&b->thread, NULL, sign_tasks, b) == 0) {
        b->running = 1;
    } else {
        sign_tasks(b);
    }
    return (PyObject *)b;
}

/* A packed run of anchors (anchors.py: Anchors.packed): `count` 32-bit hashes big-endian, then
 * each one's offset from the one before (the first's from 0) in a byte. */
typedef struct {
    const uint8_t *bytes;
    Py_ssize_t count;
} Packed;

static int packed_of(const Py_buffer *buffer, Packed *packed, const char *message) {
    if (buffer->len % 5 != 0) {
        return invalid(message);
    }
    packed->bytes = (const uint8_t *)buffer->buf;
    packed->count = buffer->len / 5;
    return 0;
}

static inline uint32_t packed_hash(const Packed *packed, Py_ssize_t i) {
    const uint8_t *p = packed->bytes + 4 * i;
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Each anchor's position: the running sum of the offsets. */
static void packed_positions(const Packed *packed, int64_t *positions) {
    int64_t at = 0;
    const uint8_t *steps = packed->bytes + 4 * packed->count;
    for (Py_ssize_t i = 0; i < packed->count; i++) {
        at += steps[i];
        positions[i] = at;
    }
}

typedef struct {
    uint32_t hash;
    uint32_t index;
} Keyed;

/* By hash, then by place: the order of a stable sort by hash. */
static int by_hash(const void *a, const void *b) {
    const Keyed *x = a, *y = b;
    if (x->hash != y->hash) {
        return x->hash < y->hash ? -1 : 1;
    }
    return (x->index > y->index) - (x->index < y->index);
}

typedef struct {
    int64_t start, last, other_start, other_last, anchors;
    Py_ssize_t order;
} Run;

/* The longest first, then the earliest start, then the first made (a stable sort's order). */
static int longest_first(const void *a, const void *b) {
    const Run *x = a, *y = b;
    int64_t lx = x->last - x->start, ly = y->last - y->start;
    if (lx != ly) {
        return lx > ly ? -1 : 1;
    }
    if (x->start != y->start) {
        return x->start < y->start ? -1 : 1;
    }
    return (x->order > y->order) - (x->order < y->order);
}

/* Python's floor division, for a negative difference too. */
static inline int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* The latest run of each diagonal band: an open-addressing map of band -> run index. */
typedef struct {
    int64_t *bands;
    Py_ssize_t *runs; /* -1: a free slot */
    size_t mask;
} Bands;

static Py_ssize_t *band_slot(Bands *map, int64_t band) {
    size_t at = (size_t)fmix64((uint64_t)band) & map->mask;
    while (map->runs[at] >= 0 && map->bands[at] != band) {
        at = (at + 1) & map->mask;
    }
    map->bands[at] = band;
    return &map->runs[at];
}

static inline Py_ssize_t band_latest(const Bands *map, int64_t band) {
    size_t at = (size_t)fmix64((uint64_t)band) & map->mask;
    while (map->runs[at] >= 0) {
        if (map->bands[at] == band) {
            return map->runs[at];
        }
        at = (at + 1) & map->mask;
    }
    return -1;
}

/* The run an anchor pair at (at, other_at) continues: the latest of its band or a neighbour's
 * that both texts advance from, within the gap and the shift (reference_anchors.py: _extendable). */
static Py_ssize_t extendable(const Bands *map, const Run *runs, int64_t band, int64_t at, int64_t other_at,
                             int64_t gap, int64_t shift) {
    const int64_t near[3] = {band, band - 1, band + 1};
    for (int n = 0; n < 3; n++) {
        Py_ssize_t index = band_latest(map, near[n]);
        if (index < 0) {
            continue;
        }
        int64_t advance = at - runs[index].last, other_advance = other_at - runs[index].other_last;
        int64_t apart = advance - other_advance;
        if (advance > 0 && advance <= gap && other_advance > 0 && (apart < 0 ? -apart : apart) <= shift) {
            return index;
        }
    }
    return -1;
}

static PyObject *passages_list(Run *runs, Py_ssize_t count, Py_ssize_t limit, int64_t k) {
    qsort(runs, (size_t)count, sizeof(Run), longest_first);
    PyObject *result = PyList_New(0);
    for (Py_ssize_t i = 0; result != NULL && i < count && i < limit; i++) {
        const Run *r = &runs[i];
        PyObject *passage = Py_BuildValue("(LLLLL)", (long long)r->start, (long long)(r->last + k),
                                          (long long)r->other_start, (long long)(r->other_last + k),
                                          (long long)r->anchors);
        if (passage == NULL || PyList_Append(result, passage) < 0) {
            Py_CLEAR(result);
        }
        Py_XDECREF(passage);
    }
    return result;
}

PyObject *passages(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer mine_buffer, other_buffer;
    Py_ssize_t k, gap, shift, repeats, limit;
    if (!PyArg_ParseTuple(args, "y*y*nnnnn", &mine_buffer, &other_buffer, &k, &gap, &shift, &repeats, &limit)) {
        return NULL;
    }
    PyObject *result = NULL;
    int64_t *mine_at = NULL, *other_at = NULL;
    Keyed *sorted = NULL;
    Run *runs = NULL;
    Bands map = {NULL, NULL, 0};
    Packed mine, other;
    if (packed_of(&mine_buffer, &mine, "mine must be packed anchors (5 bytes each)") < 0 ||
        packed_of(&other_buffer, &other, "other must be packed anchors (5 bytes each)") < 0 ||
        (k < 0 && invalid("k must be >= 0")) || (gap < 0 && invalid("gap must be >= 0")) ||
        (shift < 1 && invalid("shift must be >= 1")) || (repeats < 1 && invalid("repeats must be >= 1")) ||
        (limit < 0 && invalid("limit must be >= 0")) ||
        ((mine.count > UINT32_MAX || other.count > UINT32_MAX || repeats > PY_SSIZE_T_MAX / 2 / (mine.count + 1)) &&
         invalid("too many anchors"))) {
        goto done;
    }
    if (mine.count == 0 || other.count == 0) {
        result = PyList_New(0);
        goto done;
    }
    Py_ssize_t most = mine.count * (repeats < other.count ? repeats : other.count); /* pairs at most */
    size_t capacity = set_capacity(most);
    mine_at = PyMem_Malloc((size_t)mine.count * sizeof(int64_t));
    other_at = PyMem_Malloc((size_t)other.count * sizeof(int64_t));
    sorted = PyMem_Malloc((size_t)other.count * sizeof(Keyed));
    runs = PyMem_Malloc((size_t)most * sizeof(Run));
    map.bands = capacity ? PyMem_Malloc(capacity * sizeof(int64_t)) : NULL;
    map.runs = capacity ? PyMem_Malloc(capacity * sizeof(Py_ssize_t)) : NULL;
    if (mine_at == NULL || other_at == NULL || sorted == NULL || runs == NULL || map.bands == NULL ||
        map.runs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    map.mask = capacity - 1;
    for (size_t at = 0; at < capacity; at++) {
        map.runs[at] = -1;
    }
    packed_positions(&mine, mine_at);
    packed_positions(&other, other_at);
    for (Py_ssize_t j = 0; j < other.count; j++) {
        sorted[j].hash = packed_hash(&other, j);
        sorted[j].index = (uint32_t)j;
    }
    qsort(sorted, (size_t)other.count, sizeof(Keyed), by_hash);
    Py_ssize_t made = 0;
    for (Py_ssize_t i = 0; i < mine.count; i++) {
        uint32_t hash = packed_hash(&mine, i);
        Py_ssize_t lo = 0, hi = other.count; /* the first of `hash` in sorted */
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (sorted[mid].hash < hash) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        int64_t at = mine_at[i];
        for (Py_ssize_t j = lo; j < other.count && j < lo + repeats && sorted[j].hash == hash; j++) {
            int64_t there = other_at[sorted[j].index];
            int64_t band = floor_div(there - at, shift);
            Py_ssize_t run = extendable(&map, runs, band, at, there, gap, shift);
            if (run < 0) {
                runs[made] = (Run){at, at, there, there, 1, made};
                run = made++;
            } else {
                runs[run].last = at;
                runs[run].other_last = there;
                runs[run].anchors++;
            }
            *band_slot(&map, band) = run;
        }
    }
    result = passages_list(runs, made, limit, k);
done:
    PyMem_Free(mine_at);
    PyMem_Free(other_at);
    PyMem_Free(sorted);
    PyMem_Free(runs);
    PyMem_Free(map.bands);
    PyMem_Free(map.runs);
    PyBuffer_Release(&mine_buffer);
    PyBuffer_Release(&other_buffer);
    return result;
}

PyObject *posting_keys(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buffer;
    const char *prefix;
    Py_ssize_t prefix_len;
    if (!PyArg_ParseTuple(args, "y*y#", &buffer, &prefix, &prefix_len)) {
        return NULL;
    }
    PyObject *result = NULL;
    uint64_t *seen = NULL;
    Packed packed;
    if (packed_of(&buffer, &packed, "anchors must be packed anchors (5 bytes each)") < 0 ||
        (prefix_len > 64 && invalid("prefix must be at most 64 bytes"))) {
        goto done;
    }
    size_t capacity = set_capacity(packed.count);
    seen = capacity ? PyMem_Calloc(capacity, sizeof(uint64_t)) : NULL;
    if (seen == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyList_New(0);
    char key[64 + 4];
    memcpy(key, prefix, (size_t)prefix_len);
    for (Py_ssize_t i = 0; result != NULL && i < packed.count; i++) {
        uint64_t hash = packed_hash(&packed, i);
        if (!set_add(seen, capacity - 1, (size_t)fmix64(hash) & (capacity - 1), hash + 1)) {
            continue; /* a repeated passage joins its posting list once */
        }
        memcpy(key + prefix_len, packed.bytes + 4 * i, 4);
        PyObject *name = PyBytes_FromStringAndSize(key, prefix_len + 4);
        if (name == NULL || PyList_Append(result, name) < 0) {
            Py_CLEAR(result);
        }
        Py_XDECREF(name);
    }
done:
    PyMem_Free(seen);
    PyBuffer_Release(&buffer);
    return result;
}

/* `names` and `stored` (each stored value bytes or None) copied into new lists, checked to be as
 * long and of those types; `what` names `stored` in the errors. 0, or -1 with an error set; the
 * caller releases both lists either way. Copies: setting dict items runs no Python code for bytes
 * keys, but the sequences may be anything until checked. */
static int names_and_stored(PyObject *names, PyObject *stored, const char *what, PyObject **name_list,
                            PyObject **stored_list) {
    *name_list = PySequence_List(names);
    *stored_list = *name_list == NULL ? NULL : PySequence_List(stored);
    if (*stored_list == NULL) {
        return -1;
    }
    Py_ssize_t count = PyList_GET_SIZE(*name_list);
    if (PyList_GET_SIZE(*stored_list) != count) {
        PyErr_Format(PyExc_ValueError, "names and %s must be as long", what);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(*stored_list, i);
        if (!PyBytes_Check(PyList_GET_ITEM(*name_list, i)) || (item != Py_None && !PyBytes_Check(item))) {
            PyErr_Format(PyExc_ValueError, "names must be bytes, %s bytes or None", what);
            return -1;
        }
    }
    return 0;
}

PyObject *join_postings(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *names, *lists, *into;
    const char *entry;
    Py_ssize_t entry_len, full;
    if (!PyArg_ParseTuple(args, "OOy#nO!", &names, &lists, &entry, &entry_len, &full, &PyDict_Type, &into)) {
        return NULL;
    }
    if ((entry_len < 1 && invalid("entry must not be empty")) || (full < 1 && invalid("full must be >= 1"))) {
        return NULL;
    }
    PyObject *name_list, *stored_list, *result = NULL;
    if (names_and_stored(names, lists, "lists", &name_list, &stored_list) < 0) {
        goto done;
    }
    Py_ssize_t count = PyList_GET_SIZE(name_list);
    Py_ssize_t created = 0, filled = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *stored = PyList_GET_ITEM(stored_list, i), *joined;
        if (stored == Py_None) {
            joined = PyBytes_FromStringAndSize(entry, entry_len);
            created++;
        } else {
            Py_ssize_t size = PyBytes_GET_SIZE(stored);
            if (size >= full) {
                continue; /* full: not rewritten */
            }
            joined = PyBytes_FromStringAndSize(NULL, size + entry_len);
            if (joined != NULL) {
                memcpy(PyBytes_AS_STRING(joined), PyBytes_AS_STRING(stored), (size_t)size);
                memcpy(PyBytes_AS_STRING(joined) + size, entry, (size_t)entry_len);
                filled += size + entry_len >= full;
            }
        }
        if (joined == NULL || PyDict_SetItem(into, PyList_GET_ITEM(name_list, i), joined) < 0) {
            Py_XDECREF(joined);
            goto done;
        }
        Py_DECREF(joined);
    }
    result = Py_BuildValue("(nn)", created, filled);
done:
    Py_XDECREF(name_list);
    Py_XDECREF(stored_list);
    return result;
}

/* sizes[at] += by, the list of counts extended with zeros up to `at`: 0, or -1 with an error set. */
static int bump_size(PyObject *sizes, Py_ssize_t at, long by) {
    while (PyList_GET_SIZE(sizes) <= at) {
        PyObject *zero = PyLong_FromLong(0);
        int failed = zero == NULL || PyList_Append(sizes, zero) < 0;
        Py_XDECREF(zero);
        if (failed) {
            return -1;
        }
    }
    long count = PyLong_AsLong(PyList_GET_ITEM(sizes, at));
    if (count == -1 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *bumped = PyLong_FromLong(count + by);
    return bumped == NULL ? -1 : PyList_SetItem(sizes, at, bumped);
}

PyObject *join_buckets(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *names, *buckets, *into, *sizes;
    const char *entry;
    Py_ssize_t entry_len, limit;
    if (!PyArg_ParseTuple(args, "OOy#nO!O!", &names, &buckets, &entry, &entry_len, &limit, &PyDict_Type, &into,
                          &PyList_Type, &sizes)) {
        return NULL;
    }
    if ((entry_len < 1 && invalid("entry must not be empty")) ||
        ((limit < entry_len || limit % entry_len) && invalid("limit must be a whole number of entries, at least one"))) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(sizes); i++) {
        if (!PyLong_Check(PyList_GET_ITEM(sizes, i))) {
            invalid("sizes must be a list of ints");
            return NULL;
        }
    }
    PyObject *name_list, *stored_list, *result = NULL;
    if (names_and_stored(names, buckets, "buckets", &name_list, &stored_list) < 0) {
        goto done;
    }
    Py_ssize_t count = PyList_GET_SIZE(name_list);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *stored = PyList_GET_ITEM(stored_list, i);
        if (stored != Py_None && PyBytes_GET_SIZE(stored) % entry_len) {
            invalid("a bucket must hold whole entries");
            goto done;
        }
    }
    Py_ssize_t created = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *stored = PyList_GET_ITEM(stored_list, i);
        Py_ssize_t size = stored == Py_None ? 0 : PyBytes_GET_SIZE(stored);
        Py_ssize_t kept = size + entry_len > limit ? limit - entry_len : size;
        PyObject *joined = PyBytes_FromStringAndSize(NULL, kept + entry_len);
        if (joined == NULL) {
            goto done;
        }
        if (kept) {
            memcpy(PyBytes_AS_STRING(joined), PyBytes_AS_STRING(stored) + (size - kept), (size_t)kept);
        }
        memcpy(PyBytes_AS_STRING(joined) + kept, entry, (size_t)entry_len);
        created += size == 0;
        int failed = PyDict_SetItem(into, PyList_GET_ITEM(name_list, i), joined) < 0;
        Py_DECREF(joined);
        if (failed || (size && bump_size(sizes, size / entry_len, -1) < 0) ||
            bump_size(sizes, (kept + entry_len) / entry_len, 1) < 0) {
            goto done;
        }
    }
    result = PyLong_FromSsize_t(created);
done:
    Py_XDECREF(name_list);
    Py_XDECREF(stored_list);
    return result;
}

/* Whether the entry at `at` is `entry` (`masked`: but for its first byte's top bit). */
static int same_entry(const char *at, const char *entry, Py_ssize_t width, int masked) {
    if (masked && ((at[0] ^ entry[0]) & 0x7F)) {
        return 0;
    }
    return memcmp(at + masked, entry + masked, (size_t)(width - masked)) == 0;
}

PyObject *leave_entries(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *names, *lists, *into, *sizes;
    const char *entry;
    Py_ssize_t width, full;
    int masked;
    if (!PyArg_ParseTuple(args, "OOy#pnO!O", &names, &lists, &entry, &width, &masked, &full, &PyDict_Type, &into,
                          &sizes)) {
        return NULL;
    }
    if ((width < 1 && invalid("entry must not be empty")) || (full < 0 && invalid("full must be >= 0")) ||
        (sizes != Py_None && !PyList_Check(sizes) && invalid("sizes must be a list or None"))) {
        return NULL;
    }
    PyObject *name_list, *stored_list, *changed = NULL, *result = NULL;
    if (names_and_stored(names, lists, "stored", &name_list, &stored_list) < 0 || (changed = PyList_New(0)) == NULL) {
        goto done;
    }
    Py_ssize_t emptied = 0, unfilled = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(name_list); i++) {
        PyObject *stored = PyList_GET_ITEM(stored_list, i);
        Py_ssize_t size = stored == Py_None ? 0 : PyBytes_GET_SIZE(stored), kept = 0;
        if (size % width) {
            invalid("stored values must hold whole entries");
            goto done;
        }
        const char *from = size ? PyBytes_AS_STRING(stored) : NULL;
        PyObject *left = PyBytes_FromStringAndSize(NULL, size);
        if (left == NULL) {
            goto done;
        }
        for (Py_ssize_t at = 0; at < size; at += width) {
            if (!same_entry(from + at, entry, width, masked)) {
                memcpy(PyBytes_AS_STRING(left) + kept, from + at, (size_t)width);
                kept += width;
            }
        }
        if (kept == size) {
            Py_DECREF(left);
            continue; /* not a member (pushed out by later ones already) */
        }
        emptied += kept == 0, unfilled += full && size >= full;
        PyObject *value = kept ? (_PyBytes_Resize(&left, kept) < 0 ? NULL : left) : Py_None;
        if (!kept) {
            Py_DECREF(left);
        }
        PyObject *name = PyList_GET_ITEM(name_list, i);
        int failed = value == NULL || PyDict_SetItem(into, name, value) < 0 || PyList_Append(changed, name) < 0 ||
                     (sizes != Py_None && (bump_size(sizes, size / width, -1) < 0 ||
                                           (kept && bump_size(sizes, kept / width, 1) < 0)));
        if (kept) {
            Py_XDECREF(value);
        }
        if (failed) {
            goto done;
        }
    }
    result = Py_BuildValue("(nnO)", emptied, unfilled, changed);
done:
    Py_XDECREF(name_list);
    Py_XDECREF(stored_list);
    Py_XDECREF(changed);
    return result;
}

static void put_be32(unsigned char *at, uint32_t value) {
    at[0] = (unsigned char)(value >> 24);
    at[1] = (unsigned char)(value >> 16);
    at[2] = (unsigned char)(value >> 8);
    at[3] = (unsigned char)value;
}

static uint32_t get_be32(const unsigned char *at) {
    return (uint32_t)at[0] << 24 | (uint32_t)at[1] << 16 | (uint32_t)at[2] << 8 | (uint32_t)at[3];
}

#define DELETED 0xFFFFFFFFu

/* Packed changes (pack_changes' layout) written an entry at a time: the count, each key's length,
 * each value's (DELETED for none), then the keys, then the values. */
typedef struct {
    unsigned char *out, *key_at, *value_at;
    size_t count, written;
} Packer;

/* A bytes object for `count` entries of `keys` and `values` bytes in all, its count written;
 * NULL (MemoryError) when it cannot be allocated. */
static PyObject *packer_start(Packer *p, size_t count, size_t keys, size_t values) {
    PyObject *packed = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(4 + 5 * count + keys + values));
    if (packed != NULL) {
        p->out = (unsigned char *)PyBytes_AS_STRING(packed);
        p->key_at = p->out + 4 + 5 * count;
        p->value_at = p->key_at + keys;
        p->count = count;
        p->written = 0;
        put_be32(p->out, (uint32_t)count);
    }
    return packed;
}

/* The next entry; `value` NULL: the key deleted. */
static void packer_put(Packer *p, const void *key, size_t key_len, const void *value, size_t value_len) {
    p->out[4 + p->written] = (unsigned char)key_len;
    put_be32(p->out + 4 + p->count + 4 * p->written, value == NULL ? DELETED : (uint32_t)value_len);
    memcpy(p->key_at, key, key_len);
    p->key_at += key_len;
    if (value != NULL) {
        memcpy(p->value_at, value, value_len);
        p->value_at += value_len;
    }
    p->written++;
}

/* Whether `key` is one of the changes to pack: every one without `prefixes`, else a bytes key whose
 * first byte is among them. */
static int selected(PyObject *key, const char *prefixes, Py_ssize_t many) {
    return prefixes == NULL || (PyBytes_Check(key) && PyBytes_GET_SIZE(key) > 0 &&
                                memchr(prefixes, PyBytes_AS_STRING(key)[0], (size_t)many) != NULL);
}

/* The selected changes packed (pack_changes); Py_None where `prefixes` select none. */
static PyObject *pack_selected(PyObject *changes, const char *prefixes, Py_ssize_t many) {
    PyObject *key, *value;
    Py_ssize_t count = 0, position = 0, keys = 0, values = 0;
    while (PyDict_Next(changes, &position, &key, &value)) {
        if (!selected(key, prefixes, many)) {
            continue;
        }
        if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) > 255 || (value != Py_None && !PyBytes_Check(value))) {
            invalid("changes must map bytes of at most 255 to bytes or None");
            return NULL;
        }
        if (value != Py_None && PyBytes_GET_SIZE(value) >= (Py_ssize_t)DELETED) {
            invalid("a value must be shorter than 2**32 - 1 bytes");
            return NULL;
        }
        count++;
        keys += PyBytes_GET_SIZE(key);
        values += value == Py_None ? 0 : PyBytes_GET_SIZE(value);
    }
    if (prefixes != NULL && count == 0) {
        Py_RETURN_NONE;
    }
    if (count > UINT32_MAX || keys + values > PY_SSIZE_T_MAX - 4 - 5 * count) {
        invalid("changes too large to pack");
        return NULL;
    }
    Packer packer;
    PyObject *packed = packer_start(&packer, (size_t)count, (size_t)keys, (size_t)values);
    position = 0;
    while (packed != NULL && PyDict_Next(changes, &position, &key, &value)) {
        if (selected(key, prefixes, many)) {
            const char *stored = value == Py_None ? NULL : PyBytes_AS_STRING(value);
            packer_put(&packer, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key), stored,
                       value == Py_None ? 0 : (size_t)PyBytes_GET_SIZE(value));
        }
    }
    return packed;
}

static PyObject *pack_changes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *changes;
    if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &changes)) {
        return NULL;
    }
    return pack_selected(changes, NULL, 0);
}

static PyObject *split_changes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *changes, *key, *value;
    const char *prefixes;
    Py_ssize_t many, position = 0;
    if (!PyArg_ParseTuple(args, "O!y#", &PyDict_Type, &changes, &prefixes, &many)) {
        return NULL;
    }
    PyObject *packed = pack_selected(changes, prefixes, many), *rest = packed == NULL ? NULL : PyDict_New();
    while (rest != NULL && PyDict_Next(changes, &position, &key, &value)) {
        if (!selected(key, prefixes, many) && PyDict_SetItem(rest, key, value) < 0) {
            Py_CLEAR(rest);
        }
    }
    if (rest == NULL) {
        Py_XDECREF(packed);
        return NULL;
    }
    return Py_BuildValue("(NN)", packed, rest);
}

/* Checks packed changes (pack_changes) and returns their count, with where their keys start;
 * -1 (ValueError) when `in` is not exactly one packed dict. */
static Py_ssize_t packed_count(const unsigned char *in, size_t size, const unsigned char **keys_at) {
    if (size < 4) {
        return invalid("data must hold a count");
    }
    size_t count = get_be32(in), keys = 0, values = 0;
    if (count > (size - 4) / 5) {
        return invalid("data is shorter than its count says");
    }
    for (size_t i = 0; i < count; i++) {
        uint32_t value_len = get_be32(in + 4 + count + 4 * i);
        keys += in[4 + i];
        values += value_len == DELETED ? 0 : value_len;
    }
    if (keys + values != size - 4 - 5 * count) {
        return invalid("data's length is not what its lengths add up to");
    }
    *keys_at = in + 4 + 5 * count;
    return (Py_ssize_t)count;
}

/* One entry of a HeldTable: its key's hash, then key and value in one allocation. */
typedef struct {
    uint64_t hash;
    uint32_t value_len;
    unsigned char key_len;
    unsigned char data[];
} HeldEntry;

/* The table is HELD_SEGMENTS tables, an entry in the one its hash's top bits name, each growing
 * by itself: a doubling rehashes one segment's entries, not every entry at once, so no write
 * waits for the whole table to be copied (nor holds two copies of all its slots). */
#define HELD_SEGMENT_BITS 8
#define HELD_SEGMENTS (1 << HELD_SEGMENT_BITS)
#define HELD_SLOT_BITS 40 /* a segment's slots at most; a position (items) is segment, then slot */
#define HELD_AHEAD 8     /* entries an apply looks ahead, fetching their slots */

typedef struct {
    HeldEntry **slots; /* a power of two of them (or none yet); NULL: free */
    size_t capacity, count;
} HeldSegment;

typedef struct {
    PyObject_HEAD
    HeldSegment segments[HELD_SEGMENTS];
    size_t count;
} HeldTable;

static uint64_t key_hash(const unsigned char *key, size_t length) {
    uint64_t h = 0xCBF29CE484222325ULL; /* FNV-1a, then mixed: keys are short */
    for (size_t i = 0; i < length; i++) {
        h = (h ^ key[i]) * 0x100000001B3ULL;
    }
    return fmix64(h ^ length);
}

static HeldSegment *held_segment(HeldTable *t, uint64_t hash) { return &t->segments[hash >> (64 - HELD_SEGMENT_BITS)]; }

/* An entry's home slot in its segment: the hash's bits after the segment's, so that the slots
 * hold the entries in the order of their hashes (but for the runs that wrap round the end),
 * whatever the capacity, and a range of hashes is a range of segments and slots (pack_range). */
static size_t held_home(size_t capacity, uint64_t hash) {
    unsigned bits = (unsigned)__builtin_ctzll((unsigned long long)(capacity ? capacity : 1));
    return bits ? (size_t)((hash << HELD_SEGMENT_BITS) >> (64 - bits)) : 0;
}

/* The slot of `key`, or of the free slot where it would go (linear probing). */
static size_t held_slot(const HeldSegment *s, const unsigned char *key, size_t length, uint64_t hash) {
    size_t mask = s->capacity - 1, at = held_home(s->capacity, hash);
    for (HeldEntry *e; (e = s->slots[at]) != NULL; at = (at + 1) & mask) {
        if (e->hash == hash && e->key_len == length && memcmp(e->data, key, length) == 0) {
            break;
        }
    }
    return at;
}

/* Doubles the segment's slots (16 at first); -1 with MemoryError. */
static int held_grow(HeldSegment *s) {
    size_t capacity = s->capacity ? s->capacity * 2 : 16;
    if (capacity > SIZE_MAX / sizeof(HeldEntry *) || capacity > ((size_t)1 << HELD_SLOT_BITS)) {
        PyErr_NoMemory();
        return -1;
    }
    HeldEntry **slots = PyMem_Calloc(capacity, sizeof(HeldEntry *));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < s->capacity; i++) {
        HeldEntry *e = s->slots[i];
        if (e != NULL) {
            size_t at = held_home(capacity, e->hash);
            while (slots[at] != NULL) {
                at = (at + 1) & (capacity - 1);
            }
            slots[at] = e;
        }
    }
    PyMem_Free(s->slots);
    s->slots = slots;
    s->capacity = capacity;
    return 0;
}

/* Sets `key` to `value` (NULL: deletes it); -1 with MemoryError. */
static int held_set(HeldTable *t, const unsigned char *key, size_t key_len, const unsigned char *value, size_t value_len) {
    uint64_t hash = key_hash(key, key_len);
    HeldSegment *s = held_segment(t, hash);
    if (value != NULL && (s->count + 1) * 10 > s->capacity * 7 && held_grow(s) < 0) {
        return -1; /* kept at most 70% full: probes stay short */
    }
    if (s->capacity == 0) {
        return 0; /* nothing to delete */
    }
    size_t at = held_slot(s, key, key_len, hash), mask = s->capacity - 1;
    HeldEntry *e = s->slots[at];
    if (value == NULL) {
        if (e == NULL) {
            return 0;
        }
        PyMem_Free(e);
        s->count--, t->count--;
        /* backward-shift deletion: every entry after the gap that may move into it does */
        for (size_t next = (at + 1) & mask; s->slots[next] != NULL; next = (next + 1) & mask) {
            size_t home = held_home(s->capacity, s->slots[next]->hash);
            if (((next - home) & mask) >= ((next - at) & mask)) {
                s->slots[at] = s->slots[next];
                at = next;
            }
        }
        s->slots[at] = NULL;
        return 0;
    }
    if (e == NULL || e->value_len != value_len) {
        HeldEntry *resized = PyMem_Realloc(e, sizeof(HeldEntry) + key_len + value_len);
        if (resized == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->count += e == NULL, t->count += e == NULL;
        e = s->slots[at] = resized;
        e->hash = hash;
        e->key_len = (unsigned char)key_len;
        e->value_len = (uint32_t)value_len;
        memcpy(e->data, key, key_len);
    }
    memcpy(e->data + key_len, value, value_len);
    return 0;
}

static void held_dealloc(HeldTable *t) {
    for (int segment = 0; segment < HELD_SEGMENTS; segment++) {
        HeldSegment *s = &t->segments[segment];
        for (size_t i = 0; i < s->capacity; i++) {
            PyMem_Free(s->slots[i]);
        }
        PyMem_Free(s->slots);
    }
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t held_len(HeldTable *t) { return (Py_ssize_t)t->count; }

static PyObject *held_get_many(HeldTable *t, PyObject *keys) {
    if (!PyList_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(keys);
    uint64_t *hashes = PyMem_Malloc((size_t)(count ? count : 1) * sizeof *hashes);
    if (hashes == NULL) {
        return PyErr_NoMemory();
    }
    /* every key's slot fetched, then the entries the slots name, before any is compared: a table
     * of millions misses the cache at each, and the misses overlap */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            PyMem_Free(hashes);
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            return NULL;
        }
        hashes[i] = key_hash((const unsigned char *)PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key));
        const HeldSegment *s = held_segment(t, hashes[i]);
        if (s->capacity) {
            __builtin_prefetch(&s->slots[held_home(s->capacity, hashes[i])]);
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const HeldSegment *s = held_segment(t, hashes[i]);
        const HeldEntry *e = s->capacity ? s->slots[held_home(s->capacity, hashes[i])] : NULL;
        if (e != NULL) {
            __builtin_prefetch(e);
        }
    }
    PyObject *found = PyList_New(count);
    for (Py_ssize_t i = 0; found != NULL && i < count; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = Py_None;
        size_t length = (size_t)PyBytes_GET_SIZE(key);
        const unsigned char *at = (const unsigned char *)PyBytes_AS_STRING(key);
        const HeldSegment *s = held_segment(t, hashes[i]);
        HeldEntry *e = s->capacity && length <= 255 ? s->slots[held_slot(s, at, length, hashes[i])] : NULL;
        if (e != NULL) {
            value = PyBytes_FromStringAndSize((const char *)e->data + e->key_len, e->value_len);
            if (value == NULL) {
                Py_CLEAR(found);
                break;
            }
        } else {
            Py_INCREF(value);
        }
        PyList_SET_ITEM(found, i, value);
    }
    PyMem_Free(hashes);
    return found;
}

static PyObject *held_apply(HeldTable *t, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) {
        return NULL;
    }
    const unsigned char *in = data.buf, *key_at = NULL;
    Py_ssize_t count = packed_count(in, (size_t)data.len, &key_at);
    if (count >= 0) {
        size_t keys = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            keys += in[4 + i];
        }
        const unsigned char *value_at = key_at + keys, *ahead = key_at;
        for (Py_ssize_t i = 0; i < count + HELD_AHEAD; i++) {
            /* the slot of the entry HELD_AHEAD on fetched meanwhile: a table of millions misses the
             * cache at every entry, and the misses overlap */
            if (i < count) {
                uint64_t hash = key_hash(ahead, in[4 + i]);
                const HeldSegment *s = held_segment(t, hash);
                if (s->capacity) {
                    __builtin_prefetch(&s->slots[held_home(s->capacity, hash)]);
                }
                ahead += in[4 + i];
            }
            if (i < HELD_AHEAD) {
                continue;
            }
            Py_ssize_t at = i - HELD_AHEAD;
            uint32_t value_len = get_be32(in + 4 + count + 4 * at);
            const unsigned char *value = value_len == DELETED ? NULL : value_at;
            if (held_set(t, key_at, in[4 + at], value, value == NULL ? 0 : value_len) < 0) {
                count = -1;
                break;
            }
            key_at += in[4 + at];
            value_at += value == NULL ? 0 : value_len;
        }
    }
    PyBuffer_Release(&data);
    return count < 0 ? NULL : PyLong_FromSsize_t(count);
}

/* Entries packed as pack_changes packs a dict of them. */
static PyObject *held_chunk(HeldEntry *const *entries, size_t count) {
    size_t keys = 0, values = 0;
    for (size_t i = 0; i < count; i++) {
        keys += entries[i]->key_len;
        values += entries[i]->value_len;
    }
    Packer packer;
    PyObject *packed = packer_start(&packer, count, keys, values);
    for (size_t i = 0; packed != NULL && i < count; i++) {
        const HeldEntry *e = entries[i];
        packer_put(&packer, e->data, e->key_len, e->data + e->key_len, e->value_len);
    }
    return packed;
}

/* An entry and the first 8 bytes of its value (big-endian, zero-padded): the order pack writes. */
typedef struct {
    uint64_t order;
    HeldEntry *entry;
} Ordered;

/* Sorts `items` by `order` (stably: a byte at a time from the lowest, LSD radix), through `spare`
 * (as many); returns where the sorted run ends up, `items` or `spare`. A snapshot sorts every held
 * entry, and the bytes all entries share (a seq's high bytes) take no pass. */
static Ordered *radix_sorted(Ordered *items, Ordered *spare, size_t n) {
    for (unsigned shift = 0; shift < 64; shift += 8) {
        size_t counts[256] = {0};
        for (size_t i = 0; i < n; i++) {
            counts[(items[i].order >> shift) & 0xFF]++;
        }
        if (n == 0 || counts[(items[0].order >> shift) & 0xFF] == n) {
            continue; /* one digit for all: the order stays */
        }
        for (size_t digit = 0, at = 0; digit < 256; digit++) {
            size_t here = counts[digit];
            counts[digit] = at;
            at += here;
        }
        for (size_t i = 0; i < n; i++) {
            spare[counts[(items[i].order >> shift) & 0xFF]++] = items[i];
        }
        Ordered *swap = items;
        items = spare;
        spare = swap;
    }
    return items;
}

/* Entries into `order` with the first 8 bytes of their value, the order a snapshot writes them in:
 * the entries an article wrote side by side (its seq in each of its buckets and posting lists),
 * which compresses the chunks as the order of their writes did. */
static void held_take(Ordered *order, size_t *n, HeldEntry *e) {
    uint64_t first = 0;
    for (size_t j = 0; j < 8; j++) {
        first = first << 8 | (j < e->value_len ? e->data[e->key_len + j] : 0);
    }
    order[(*n)++] = (Ordered){first, e};
}

/* The entries whose hash is in the `step`-th of `steps` equal ranges (a power of two), sorted, in
 * chunks of at most `most` bytes. Their homes
 * are that range of slots; the scan goes on past it to the end of the run of occupied slots there,
 * round the end of the table if that run wraps: an entry sits at its home or after it. */
static PyObject *held_pack_range(HeldTable *t, PyObject *args) {
    Py_ssize_t step, steps, most;
    if (!PyArg_ParseTuple(args, "nnn", &step, &steps, &most)) {
        return NULL;
    }
    if (most < 1 || steps < 1 || (steps & (steps - 1)) != 0 || step < 0 || step >= steps) {
        invalid("most must be at least 1, steps a power of two, step one of them");
        return NULL;
    }
    unsigned range_bits = (unsigned)__builtin_ctzll((unsigned long long)steps);
    uint64_t low = range_bits ? (uint64_t)step << (64 - range_bits) : 0;
    uint64_t last = range_bits ? low + (UINT64_MAX >> range_bits) : UINT64_MAX;
    Ordered *order = PyMem_Malloc((t->count ? t->count : 1) * sizeof(Ordered));
    Ordered *spare = PyMem_Malloc((t->count ? t->count : 1) * sizeof(Ordered));
    HeldEntry **entries = PyMem_Malloc((t->count ? t->count : 1) * sizeof(HeldEntry *));
    PyObject *chunks = order == NULL || spare == NULL || entries == NULL ? PyErr_NoMemory() : PyList_New(0);
    size_t n = 0;
    for (uint64_t segment = low >> (64 - HELD_SEGMENT_BITS); chunks != NULL && segment <= last >> (64 - HELD_SEGMENT_BITS);
         segment++) {
        const HeldSegment *s = &t->segments[segment];
        uint64_t first = segment << (64 - HELD_SEGMENT_BITS), end = first | (UINT64_MAX >> HELD_SEGMENT_BITS);
        first = first > low ? first : low, end = end < last ? end : last;
        if (s->capacity == 0) {
            continue;
        }
        size_t from = held_home(s->capacity, first), to = held_home(s->capacity, end) + 1, at = from;
        for (; at < s->capacity && (at < to || s->slots[at] != NULL); at++) {
            HeldEntry *e = s->slots[at];
            if (e != NULL && e->hash >= first && e->hash <= end) {
                held_take(order, &n, e);
            }
        }
        size_t wrapped = 0; /* the run at the end goes on from the first slot */
        for (; at == s->capacity && from > 0 && wrapped < from && s->slots[wrapped] != NULL; wrapped++) {
            HeldEntry *e = s->slots[wrapped];
            if (e->hash >= first && e->hash <= end) {
                held_take(order, &n, e);
            }
        }
    }
    if (chunks != NULL) {
        const Ordered *sorted = radix_sorted(order, spare, n);
        for (size_t i = 0; i < n; i++) {
            entries[i] = sorted[i].entry;
        }
    }
    size_t from = 0, bytes = 0;
    for (size_t i = 0; chunks != NULL && i <= n; i++) {
        size_t size = i < n ? (size_t)entries[i]->key_len + entries[i]->value_len : 0;
        if (i > from && (i == n || bytes + size > (size_t)most)) {
            PyObject *chunk = held_chunk(entries + from, i - from);
            if (chunk == NULL || PyList_Append(chunks, chunk) < 0) {
                Py_CLEAR(chunks);
            }
            Py_XDECREF(chunk);
            from = i, bytes = 0;
        }
        bytes += size;
    }
    PyMem_Free(entries);
    PyMem_Free(spare);
    PyMem_Free(order);
    return chunks;
}

/* Slots for `count` entries at once, before a snapshot's chunks are applied: they come a range of
 * hashes at a time, and homed in a table sized for fewer they would crowd into its first slots. */
static PyObject *held_reserve(HeldTable *t, PyObject *args) {
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "n", &count)) {
        return NULL;
    }
    if (count < 0) {
        invalid("count must not be negative");
        return NULL;
    }
    /* each segment's share, with room for its spread about that (a few standard deviations) */
    double share = (double)count / HELD_SEGMENTS;
    size_t each = (size_t)(share + 4.0 * sqrt(share)) + 1;
    for (int segment = 0; count && segment < HELD_SEGMENTS; segment++) {
        HeldSegment *s = &t->segments[segment];
        while (each * 10 > s->capacity * 7) {
            if (held_grow(s) < 0) {
                return NULL;
            }
        }
    }
    Py_RETURN_NONE;
}

static PyObject *held_items(HeldTable *t, PyObject *args) {
    Py_ssize_t start, most;
    if (!PyArg_ParseTuple(args, "nn", &start, &most)) {
        return NULL;
    }
    if (start < 0 || most < 0) {
        invalid("start and most must not be negative");
        return NULL;
    }
    PyObject *pairs = PyList_New(0);
    size_t segment = (size_t)start >> HELD_SLOT_BITS, at = (size_t)start & (((size_t)1 << HELD_SLOT_BITS) - 1);
    for (; pairs != NULL && segment < HELD_SEGMENTS && PyList_GET_SIZE(pairs) < most; segment++, at = 0) {
        const HeldSegment *s = &t->segments[segment];
        for (; pairs != NULL && at < s->capacity && PyList_GET_SIZE(pairs) < most; at++) {
            const HeldEntry *e = s->slots[at];
            if (e != NULL) {
                PyObject *pair = Py_BuildValue("(y#y#)", e->data, (Py_ssize_t)e->key_len, e->data + e->key_len,
                                               (Py_ssize_t)e->value_len);
                if (pair == NULL || PyList_Append(pairs, pair) < 0) {
                    Py_CLEAR(pairs);
                }
                Py_XDECREF(pair);
            }
        }
        if (at < s->capacity) {
            break; /* `most` listed: the next call goes on from this slot */
        }
    }
    Py_ssize_t next = (Py_ssize_t)(segment << HELD_SLOT_BITS | at);
    return pairs == NULL ? NULL : Py_BuildValue("(Nn)", pairs, next);
}

static PyMethodDef held_methods[] = {
    {"get_many", (PyCFunction)held_get_many, METH_O, "Each key's value, None where absent."},
    {"apply", (PyCFunction)held_apply, METH_VARARGS, "Packed changes (pack_changes) applied; their count."},
    {"pack_range", (PyCFunction)held_pack_range, METH_VARARGS,
     "The entries of the `step`-th of `steps` ranges of hashes packed, in chunks of at most `most` bytes."},
    {"items", (PyCFunction)held_items, METH_VARARGS, "At most `most` pairs from slot `start`, and the next slot."},
    {"reserve", (PyCFunction)held_reserve, METH_VARARGS, "Slots for `count` entries."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods held_sequence = {.sq_length = (lenfunc)held_len};

static PyTypeObject HeldTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "neardup.core._sketch.HeldTable",
    .tp_basicsize = sizeof(HeldTable),
    .tp_dealloc = (destructor)held_dealloc,
    .tp_as_sequence = &held_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes keys to bytes values in one compact table (state/held.py).",
    .tp_methods = held_methods,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"join_buckets", join_buckets, METH_VARARGS, "A member appended to LSH buckets, into a dict, their sizes counted."},
    {"pack_changes", pack_changes, METH_VARARGS, "A dict of bytes to bytes or None, packed."},
    {"split_changes", split_changes, METH_VARARGS, "The changes of some key families packed, and the others."},
    {"anchors", anchors, METH_VARARGS, "Winnowed anchors of code points: 32-bit hashes and positions."},
    {"sign_batch", sign_batch, METH_VARARGS, "oph_minima, finish and anchors over many texts, on a thread of its own."},
    {"oph_minima", oph_minima, METH_VARARGS, "Shingle, permute and keep each bin's minimum; returns the distinct count."},
    {"finish", finish, METH_VARARGS, "Signature and 8-bit verifier from the verifier's bin minima."},
    {"band_keys", band_keys, METH_VARARGS, "The LSH band keys of a signature (lsh.band_keys)."},
    {"collapse_spaces", collapse_spaces, METH_VARARGS, "Runs of spaces as one U+0020, none at the ends."},
    {"scores", scores, METH_VARARGS, "Jaccard and containment estimates of a verifier against candidates'."},
    {"rank", rank, METH_VARARGS, "The candidates scored, best first, and the match among them."},
    {"passages", passages, METH_VARARGS, "The passages two packed anchor runs share, longest first."},
    {"posting_keys", posting_keys, METH_VARARGS, "The distinct posting keys of packed anchors."},
    {"join_postings", join_postings, METH_VARARGS, "An entry appended to posting lists, into a dict."},
    {"leave_entries", leave_entries, METH_VARARGS, "An entry taken out of buckets or posting lists, into a dict."},
    {"count_postings", count_postings, METH_VARARGS, "Entries counted over posting lists, the most counted first."},
    {"merge_buckets", merge_buckets, METH_VARARGS, "The distinct arrival numbers of LSH buckets, in order of first appearance."},
    {"varints", varints, METH_VARARGS, "Unsigned LEB128 varints from a position of a buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sketch", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__sketch(void) {
    if (name_verifier == NULL) {
        name_verifier = PyUnicode_InternFromString("verifier");
        name_shingle_count = PyUnicode_InternFromString("shingle_count");
        name_seq = PyUnicode_InternFromString("seq");
        if (name_verifier == NULL || name_shingle_count == NULL || name_seq == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&HeldTableType) < 0 || PyType_Ready(&SignBatchType) < 0 || decide_init() < 0) {
        return NULL;
    }
    PyObject *created = PyModule_Create(&module);
    if (created != NULL && (PyModule_AddFunctions(created, decide_methods) < 0 ||
                            PyModule_AddFunctions(created, shard_methods) < 0 ||
                            PyModule_AddObjectRef(created, "HeldTable", (PyObject *)&HeldTableType) < 0 ||
                            PyModule_AddObjectRef(created, "SignBatch", (PyObject *)&SignBatchType) < 0)) {
        Py_CLEAR(created);
    }
    return created;
}
