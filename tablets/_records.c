/* The record walker: checks the records of one Kafka v2 record batch as a
 * stream, in constant memory, skipping keys, values and headers.
 *
 * A batch's records (after the 61-byte header, decompressed if need be) are
 * fed in chunks of any size; the walker keeps its place between chunks, so a
 * record, or even a varint, may straddle two chunks. Nothing of a key, value
 * or header is ever copied. What it checks, as Kafka's DefaultRecord reader
 * does (and a little more, see validate.py):
 *
 *   - every varint ends within 5 bytes (10 for the timestamp delta);
 *   - each record's length is not negative and equals the bytes its fields
 *     take; no field runs past the end of its record;
 *   - key, value and header-value lengths are -1 (null) or fit; header-key
 *     lengths and the header count are not negative;
 *   - offset deltas are 0, 1, 2, ... (when asked to);
 *   - exactly the declared number of records, and no byte after the last.
 *
 * While walking it computes the largest record timestamp, counts records
 * whose timestamp falls outside an allowed range (and, for a compacted topic,
 * records without a key), and can stop at the first record at or after a
 * target timestamp (ListOffsets by time).
 *
 * For compaction (key_seed), it reports each record once it has ended: its
 * offset delta, timestamp, a 128-bit SipHash-2-4 digest of its key (keyed by
 * the seed, so digests compare within one compaction run and cannot be
 * steered by producers), whether its value is null, and where its offset
 * delta field and its end lie in the decompressed stream, so the caller can
 * copy the records it keeps. Keys are hashed as they stream past: a key is
 * never held, however long.
 *
 * With release_gil (worker threads), large chunks are walked without the GIL;
 * on the event loop, where batches are small, releasing it costs more than the
 * walk (the loop may then wait for another thread to hand it back).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    P_LENGTH,
    P_ATTRIBUTES,
    P_TIMESTAMP,
    P_OFFSET,
    P_KEY,
    P_VALUE,
    P_HEADERS,
    P_HEADER_KEY,
    P_HEADER_VALUE,
    P_SKIP,
    /* pseudo-phases: reached and left without input (see settle) */
    P_NEXT_HEADER,
    P_RECORD_END,
};

/* With release_gil, chunks this large are walked without the GIL. */
#define RELEASE_GIL_BYTES 65536

static PyObject *RecordError;

/* SipHash-2-4 with a 128-bit result, fed as a stream. */
typedef struct {
    uint64_t v0, v1, v2, v3;
    uint64_t tail;  /* up to 7 bytes not yet compressed, little-endian */
    int ntail;
    uint64_t len;
} Sip;

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND(s)                                                              \
    do {                                                                         \
        (s)->v0 += (s)->v1; (s)->v1 = ROTL((s)->v1, 13); (s)->v1 ^= (s)->v0;     \
        (s)->v0 = ROTL((s)->v0, 32);                                             \
        (s)->v2 += (s)->v3; (s)->v3 = ROTL((s)->v3, 16); (s)->v3 ^= (s)->v2;     \
        (s)->v0 += (s)->v3; (s)->v3 = ROTL((s)->v3, 21); (s)->v3 ^= (s)->v0;     \
        (s)->v2 += (s)->v1; (s)->v1 = ROTL((s)->v1, 17); (s)->v1 ^= (s)->v2;     \
        (s)->v2 = ROTL((s)->v2, 32);                                             \
    } while (0)

static void
sip_init(Sip *s, uint64_t k0, uint64_t k1)
{
    s->v0 = k0 ^ 0x736f6d6570736575ULL;
    s->v1 = k1 ^ 0x646f72616e646f6dULL ^ 0xee;
    s->v2 = k0 ^ 0x6c7967656e657261ULL;
    s->v3 = k1 ^ 0x7465646279746573ULL;
    s->tail = 0;
    s->ntail = 0;
    s->len = 0;
}

static inline void
sip_compress(Sip *s, uint64_t m)
{
    s->v3 ^= m;
    SIPROUND(s);
    SIPROUND(s);
    s->v0 ^= m;
}

static void
sip_update(Sip *s, const uint8_t *p, Py_ssize_t n)
{
    s->len += (uint64_t)n;
    while (n > 0 && s->ntail > 0) {
        s->tail |= (uint64_t)*p++ << (8 * s->ntail++);
        n--;
        if (s->ntail == 8) {
            sip_compress(s, s->tail);
            s->tail = 0;
            s->ntail = 0;
        }
    }
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t m = 0;
        for (int i = 7; i >= 0; i--)
            m = (m << 8) | p[i];
        sip_compress(s, m);
    }
    for (; n > 0; n--)
        s->tail |= (uint64_t)*p++ << (8 * s->ntail++);
}

static void
sip_final(Sip *s, uint8_t out[16])
{
    sip_compress(s, s->tail | (s->len << 56));
    s->v2 ^= 0xee;
    for (int i = 0; i < 4; i++)
        SIPROUND(s);
    uint64_t h0 = s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
    s->v1 ^= 0xdd;
    for (int i = 0; i < 4; i++)
        SIPROUND(s);
    uint64_t h1 = s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
    memcpy(out, &h0, 8);
    memcpy(out + 8, &h1, 8);
}

/* One ended record, as compaction needs it (key_seed). */
typedef struct {
    int32_t delta;
    uint8_t has_key, tombstone;
    int64_t timestamp;
    int64_t body_pos, end_pos;
    uint8_t digest[16];
} KeyedRecord;

typedef struct {
    PyObject_HEAD
    /* what the batch declares and what to check */
    int32_t count;
    int64_t base_timestamp;
    int contiguous;
    int check_timestamps;
    int64_t min_timestamp, max_timestamp_allowed;
    int search;
    int64_t target;
    int64_t min_delta;
    int collect;
    int release_gil;
    int require_keys;
    int keyed;
    uint64_t seed0, seed1;
    Py_ssize_t max_errors;
    /* where the walk is */
    int phase, after_skip;
    int32_t done;
    int32_t length;       /* the current record's declared length */
    int64_t body_left;    /* bytes of the current record not yet accounted for */
    int64_t skip_left;
    int32_t headers_left;
    int64_t timestamp;
    uint8_t carry[10];    /* the start of a varint cut by the end of a chunk */
    int carry_len;
    int busy;
    int failed;
    int32_t delta;        /* the current record's offset delta */
    int ts_bad;           /* the current record was counted in bad_timestamps */
    int64_t chunk_base;   /* stream position of the chunk being walked */
    const uint8_t *origin; /* its first byte (valid during a walk) */
    int64_t body_pos;     /* stream position of the current record's offset delta */
    int has_key, tombstone, hashing;
    Sip sip;
    uint8_t digest[16];
    /* results */
    int64_t max_timestamp;
    Py_ssize_t bad_count, bad_len;
    int32_t *bad_index;
    int64_t *bad_ts;
    int found;
    int32_t found_delta;
    int64_t found_ts;
    int32_t *col_delta;
    int64_t *col_ts;
    Py_ssize_t col_len, col_cap;
    Py_ssize_t bad_key_count, bad_key_len;
    int32_t *bad_key_index;
    KeyedRecord *keyed_out;
    Py_ssize_t keyed_len, keyed_cap;
    char error[256];
} Walker;

/* A varint of at most maxlen bytes: bytes used, 0 when avail ends first, -1
 * when it is longer than maxlen. Bits past 64 are dropped, as Java does. */
static inline int
read_uvarint(const uint8_t *p, Py_ssize_t avail, int maxlen, uint64_t *out)
{
    uint64_t value = 0;
    int shift = 0;
    for (int i = 0; i < maxlen; i++) {
        if (i >= avail)
            return 0;
        uint8_t b = p[i];
        value |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = value;
            return i + 1;
        }
        shift += 7;
    }
    return -1;
}

static inline int32_t
zigzag32(uint64_t raw)
{
    uint32_t v = (uint32_t)raw;
    return (int32_t)((v >> 1) ^ (0u - (v & 1u)));
}

static inline int64_t
zigzag64(uint64_t raw)
{
    return (int64_t)((raw >> 1) ^ (0ull - (raw & 1ull)));
}

#define FAIL(...)                                                   \
    do {                                                            \
        snprintf(w->error, sizeof w->error, __VA_ARGS__);           \
        return -1;                                                  \
    } while (0)

/* Take one varint from the input (and any bytes carried from the previous
 * chunk). ``limit`` is how many bytes it may span (the rest of its record).
 * Returns its size in bytes, 0 when the input ended first (the bytes are
 * carried), -1 on error. */
static int
take_varint(Walker *w, const uint8_t **pp, Py_ssize_t *pn, int maxlen, int64_t limit,
            uint64_t *out)
{
    const uint8_t *p = *pp;
    Py_ssize_t n = *pn;
    if (w->carry_len == 0) {
        Py_ssize_t avail = (int64_t)n < limit ? n : (Py_ssize_t)limit;
        int r = read_uvarint(p, avail, maxlen, out);
        if (r > 0) {
            *pp = p + r;
            *pn = n - r;
            return r;
        }
        if (r < 0)
            FAIL("record %d: a varint longer than %d bytes", w->done, maxlen);
        if (limit < (int64_t)n)
            FAIL("record %d: a field runs past the end of the record", w->done);
        memcpy(w->carry, p, (size_t)n);
        w->carry_len = (int)n;
        *pp = p + n;
        *pn = 0;
        return 0;
    }
    uint8_t tmp[24];
    Py_ssize_t take = n < 10 ? n : 10;
    memcpy(tmp, w->carry, (size_t)w->carry_len);
    memcpy(tmp + w->carry_len, p, (size_t)take);
    Py_ssize_t total = w->carry_len + take;
    Py_ssize_t avail = (int64_t)total < limit ? total : (Py_ssize_t)limit;
    int r = read_uvarint(tmp, avail, maxlen, out);
    if (r > 0) {
        Py_ssize_t used = r - w->carry_len;
        w->carry_len = 0;
        *pp = p + used;
        *pn = n - used;
        return r;
    }
    if (r < 0)
        FAIL("record %d: a varint longer than %d bytes", w->done, maxlen);
    if (limit < (int64_t)total)
        FAIL("record %d: a field runs past the end of the record", w->done);
    memcpy(w->carry + w->carry_len, p, (size_t)n);
    w->carry_len += (int)n;
    *pp = p + n;
    *pn = 0;
    return 0;
}

/* The stream position of p, a pointer into the chunk being walked. */
static inline int64_t
here(const Walker *w, const uint8_t *p)
{
    return w->chunk_base + (int64_t)(p - w->origin);
}

/* A record has ended at stream position end: report it (key_seed). */
static int
record_done(Walker *w, int64_t end)
{
    if (!w->keyed)
        return 0;
    if (w->keyed_len == w->keyed_cap) {
        Py_ssize_t cap = w->keyed_cap ? w->keyed_cap * 2 : 256;
        KeyedRecord *k = realloc(w->keyed_out, (size_t)cap * sizeof *k);
        if (k == NULL)
            return -2;
        w->keyed_out = k;
        w->keyed_cap = cap;
    }
    KeyedRecord *r = &w->keyed_out[w->keyed_len++];
    r->delta = w->delta;
    r->has_key = (uint8_t)w->has_key;
    r->tombstone = (uint8_t)w->tombstone;
    r->timestamp = w->timestamp;
    r->body_pos = w->body_pos;
    r->end_pos = end;
    memcpy(r->digest, w->digest, 16);
    return 0;
}

/* Leave the pseudo-phases, which need no input; p is where the walk is. */
static int
settle(Walker *w, const uint8_t *p)
{
    for (;;) {
        if (w->phase == P_NEXT_HEADER) {
            w->headers_left--;
            w->phase = w->headers_left > 0 ? P_HEADER_KEY : P_RECORD_END;
        } else if (w->phase == P_RECORD_END) {
            if (w->body_left != 0)
                FAIL("record %d: its length is %d bytes but its fields take %lld", w->done,
                     w->length, (long long)(w->length - w->body_left));
            int r = record_done(w, here(w, p));
            if (r < 0)
                return r;
            w->done++;
            w->phase = P_LENGTH;
        } else {
            return 0;
        }
    }
}

/* A length-delimited field: skip ``size`` bytes, then go to ``next``. */
static int
skip_then(Walker *w, int32_t size, int next, const uint8_t *p)
{
    if (size > w->body_left)
        FAIL("record %d: a field of %d bytes runs past the end of the record", w->done, size);
    if (size > 0) {
        w->body_left -= size;
        w->skip_left = size;
        w->after_skip = next;
        w->phase = P_SKIP;
        return 0;
    }
    w->phase = next;
    return settle(w, p);
}

/* The checks and results of one record whose timestamp, offset delta and
 * key length are known: -2 when out of memory. */
static int
record_checks(Walker *w, int32_t delta, int key_null)
{
    int64_t ts = w->timestamp;
    if (ts > w->max_timestamp)
        w->max_timestamp = ts;
    if (w->require_keys && key_null) {
        /* As Kafka, a record without a key is named for that alone. */
        if (w->bad_key_len < w->max_errors)
            w->bad_key_index[w->bad_key_len++] = w->done;
        w->bad_key_count++;
    } else if (w->check_timestamps && ts != -1 &&
               (ts < w->min_timestamp || ts > w->max_timestamp_allowed)) {
        if (w->bad_len < w->max_errors) {
            w->bad_index[w->bad_len] = w->done;
            w->bad_ts[w->bad_len] = ts;
            w->bad_len++;
        }
        w->bad_count++;
    }
    if (w->search && ts >= w->target && delta >= w->min_delta) {
        w->found = 1;
        w->found_delta = delta;
        w->found_ts = ts;
    }
    if (w->collect) {
        if (w->col_len == w->col_cap) {
            Py_ssize_t cap = w->col_cap ? w->col_cap * 2 : 256;
            int32_t *d = realloc(w->col_delta, (size_t)cap * sizeof *d);
            if (d == NULL)
                return -2;
            w->col_delta = d;
            int64_t *t = realloc(w->col_ts, (size_t)cap * sizeof *t);
            if (t == NULL)
                return -2;
            w->col_ts = t;
            w->col_cap = cap;
        }
        w->col_delta[w->col_len] = delta;
        w->col_ts[w->col_len] = ts;
        w->col_len++;
    }
    return 0;
}

/* One whole, well-formed record at p, read in one go: its size in bytes, 0
 * when it is not whole in the buffer or anything about it is odd (the
 * phase-by-phase path below then reads it again and names the fault), -2
 * when out of memory. Changes nothing unless it succeeds. */
static inline Py_ssize_t
fast_record(Walker *w, const uint8_t *p, Py_ssize_t n)
{
    uint64_t raw;
    int r = read_uvarint(p, n, 5, &raw);
    if (r <= 0)
        return 0;
    int32_t length = zigzag32(raw);
    if (length < 6 || length > n - r)
        return 0;
    const uint8_t *q = p + r + 1; /* past the length and the attributes */
    const uint8_t *end = p + r + length;
    if ((r = read_uvarint(q, end - q, 10, &raw)) <= 0)
        return 0;
    q += r;
    int64_t timestamp = (int64_t)((uint64_t)w->base_timestamp + (uint64_t)zigzag64(raw));
    const uint8_t *body = q;
    if ((r = read_uvarint(q, end - q, 5, &raw)) <= 0)
        return 0;
    q += r;
    int32_t delta = zigzag32(raw);
    if (w->contiguous && delta != w->done)
        return 0;
    const uint8_t *key = NULL;
    int32_t sizes[2];
    for (int field = 0; field < 2; field++) { /* key, value */
        if ((r = read_uvarint(q, end - q, 5, &raw)) <= 0)
            return 0;
        q += r;
        int32_t size = zigzag32(raw);
        if (size < -1 || size > end - q)
            return 0;
        sizes[field] = size;
        if (field == 0)
            key = q;
        if (size > 0)
            q += size;
    }
    if ((r = read_uvarint(q, end - q, 5, &raw)) <= 0)
        return 0;
    q += r;
    int32_t headers = zigzag32(raw);
    if (headers < 0 || headers > end - q)
        return 0;
    for (int32_t i = 0; i < headers; i++) {
        for (int field = 0; field < 2; field++) { /* header key, header value */
            if ((r = read_uvarint(q, end - q, 5, &raw)) <= 0)
                return 0;
            q += r;
            int32_t size = zigzag32(raw);
            if (size < -field || size > end - q)
                return 0;
            if (size > 0)
                q += size;
        }
    }
    if (q != end)
        return 0;
    w->timestamp = timestamp;
    w->delta = delta;
    if (record_checks(w, delta, sizes[0] == -1) < 0)
        return -2;
    if (w->keyed) {
        w->has_key = sizes[0] >= 0;
        w->tombstone = sizes[1] == -1;
        w->body_pos = here(w, body);
        if (w->has_key) {
            Sip sip;
            sip_init(&sip, w->seed0, w->seed1);
            sip_update(&sip, key, sizes[0]);
            sip_final(&sip, w->digest);
        }
        if (record_done(w, here(w, end)) < 0)
            return -2;
    }
    w->done++;
    return end - p;
}

/* Walk one chunk. 0: consumed (or found), -1: invalid (w->error), -2: no memory. */
static int
walk(Walker *w, const uint8_t *p, Py_ssize_t n)
{
    uint64_t raw;
    int r;
    int32_t size;
    w->origin = p;
    while (n > 0 && !w->found) {
        switch (w->phase) {
        case P_LENGTH:
            if (w->carry_len == 0 && w->done < w->count) {
                Py_ssize_t size = fast_record(w, p, n);
                if (size < 0)
                    return -2;
                if (size > 0) {
                    p += size;
                    n -= size;
                    continue;
                }
            }
            if (w->done == w->count)
                FAIL("bytes follow the last of the %d records the batch declares", w->count);
            r = take_varint(w, &p, &n, 5, INT64_MAX, &raw);
            if (r <= 0)
                return r;
            w->length = zigzag32(raw);
            if (w->length < 0)
                FAIL("record %d: negative length %d", w->done, w->length);
            w->body_left = w->length;
            w->phase = P_ATTRIBUTES;
            break;
        case P_ATTRIBUTES:
            if (w->body_left < 1)
                FAIL("record %d: its length is %d bytes but its fields take more", w->done,
                     w->length);
            p++;
            n--;
            w->body_left--;
            w->phase = P_TIMESTAMP;
            break;
        case P_TIMESTAMP:
            r = take_varint(w, &p, &n, 10, w->body_left, &raw);
            if (r <= 0)
                return r;
            w->body_left -= r;
            w->timestamp = (int64_t)((uint64_t)w->base_timestamp + (uint64_t)zigzag64(raw));
            w->body_pos = here(w, p);
            w->phase = P_OFFSET;
            break;
        case P_OFFSET:
            r = take_varint(w, &p, &n, 5, w->body_left, &raw);
            if (r <= 0)
                return r;
            w->body_left -= r;
            size = zigzag32(raw);
            if (w->contiguous && size != w->done)
                FAIL("record %d: offset delta %d, expected %d", w->done, size, w->done);
            w->delta = size;
            w->phase = P_KEY;
            break;
        case P_KEY:
        case P_VALUE:
            r = take_varint(w, &p, &n, 5, w->body_left, &raw);
            if (r <= 0)
                return r;
            w->body_left -= r;
            size = zigzag32(raw);
            if (size < -1)
                FAIL("record %d: %s length %d", w->done, w->phase == P_KEY ? "key" : "value",
                     size);
            if (w->phase == P_KEY) {
                r = record_checks(w, w->delta, size == -1);
                if (r < 0)
                    return r;
                w->has_key = size >= 0;
                if (w->keyed && w->has_key) {
                    sip_init(&w->sip, w->seed0, w->seed1);
                    w->hashing = 1;
                    if (size == 0) {
                        sip_final(&w->sip, w->digest);
                        w->hashing = 0;
                    }
                }
            } else {
                w->tombstone = size == -1;
            }
            r = skip_then(w, size, w->phase == P_KEY ? P_VALUE : P_HEADERS, p);
            if (r < 0)
                return r;
            break;
        case P_HEADERS:
            r = take_varint(w, &p, &n, 5, w->body_left, &raw);
            if (r <= 0)
                return r;
            w->body_left -= r;
            size = zigzag32(raw);
            if (size < 0 || size > w->body_left)
                FAIL("record %d: invalid header count %d", w->done, size);
            w->headers_left = size;
            w->phase = size > 0 ? P_HEADER_KEY : P_RECORD_END;
            r = settle(w, p);
            if (r < 0)
                return r;
            break;
        case P_HEADER_KEY:
        case P_HEADER_VALUE:
            r = take_varint(w, &p, &n, 5, w->body_left, &raw);
            if (r <= 0)
                return r;
            w->body_left -= r;
            size = zigzag32(raw);
            if (size < (w->phase == P_HEADER_KEY ? 0 : -1))
                FAIL("record %d: header %s length %d", w->done,
                     w->phase == P_HEADER_KEY ? "key" : "value", size);
            r = skip_then(w, size, w->phase == P_HEADER_KEY ? P_HEADER_VALUE : P_NEXT_HEADER,
                          p);
            if (r < 0)
                return r;
            break;
        case P_SKIP: {
            Py_ssize_t take = (int64_t)n < w->skip_left ? n : (Py_ssize_t)w->skip_left;
            if (w->hashing)
                sip_update(&w->sip, p, take);
            p += take;
            n -= take;
            w->skip_left -= take;
            if (w->skip_left == 0) {
                if (w->hashing) {
                    sip_final(&w->sip, w->digest);
                    w->hashing = 0;
                }
                w->phase = w->after_skip;
                r = settle(w, p);
                if (r < 0)
                    return r;
            }
            break;
        }
        default:
            FAIL("walker in an unknown state %d", w->phase);
        }
    }
    return 0;
}

static void
Walker_dealloc(Walker *w)
{
    free(w->bad_index);
    free(w->bad_ts);
    free(w->col_delta);
    free(w->col_ts);
    free(w->bad_key_index);
    free(w->keyed_out);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static int
Walker_init(Walker *w, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"count", "base_timestamp", "contiguous", "timestamp_range",
                             "max_errors", "target", "min_delta", "collect", "release_gil",
                             "require_keys", "key_seed", NULL};
    int count;
    long long base_timestamp, min_delta = 0;
    int contiguous = 1, collect = 0, release_gil = 0, require_keys = 0;
    PyObject *range = Py_None, *target = Py_None, *seed = Py_None;
    Py_ssize_t max_errors = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iL|pOnOLpppO", kwlist, &count,
                                     &base_timestamp, &contiguous, &range, &max_errors, &target,
                                     &min_delta, &collect, &release_gil, &require_keys, &seed))
        return -1;
    if (count < 0 || max_errors < 0) {
        PyErr_SetString(PyExc_ValueError, "count and max_errors must not be negative");
        return -1;
    }
    if (seed != Py_None && (!PyBytes_Check(seed) || PyBytes_GET_SIZE(seed) != 16 || collect)) {
        PyErr_SetString(PyExc_ValueError, "key_seed is 16 bytes, and excludes collect");
        return -1;
    }
    free(w->bad_index);
    free(w->bad_ts);
    free(w->col_delta);
    free(w->col_ts);
    free(w->bad_key_index);
    free(w->keyed_out);
    memset((char *)w + offsetof(Walker, count), 0, sizeof(Walker) - offsetof(Walker, count));
    w->count = count;
    w->base_timestamp = base_timestamp;
    w->contiguous = contiguous;
    w->collect = collect;
    w->release_gil = release_gil;
    w->min_delta = min_delta;
    w->require_keys = require_keys;
    if (seed != Py_None) {
        w->keyed = 1;
        memcpy(&w->seed0, PyBytes_AS_STRING(seed), 8);
        memcpy(&w->seed1, PyBytes_AS_STRING(seed) + 8, 8);
    }
    w->max_timestamp = -1; /* Kafka's NO_TIMESTAMP */
    w->phase = P_LENGTH;
    if (range != Py_None) {
        long long lo, hi;
        if (!PyArg_ParseTuple(range, "LL;timestamp_range is (min, max)", &lo, &hi))
            return -1;
        w->check_timestamps = 1;
        w->min_timestamp = lo;
        w->max_timestamp_allowed = hi;
    }
    if (target != Py_None) {
        long long t = PyLong_AsLongLong(target);
        if (t == -1 && PyErr_Occurred())
            return -1;
        w->search = 1;
        w->target = t;
    }
    w->max_errors = max_errors;
    if (max_errors > 0) {
        w->bad_index = malloc((size_t)max_errors * sizeof *w->bad_index);
        w->bad_ts = malloc((size_t)max_errors * sizeof *w->bad_ts);
        w->bad_key_index = malloc((size_t)max_errors * sizeof *w->bad_key_index);
        if (w->bad_index == NULL || w->bad_ts == NULL || w->bad_key_index == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

static PyObject *
keyed_list(Walker *w)
{
    PyObject *list = PyList_New(w->keyed_len);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < w->keyed_len; i++) {
        KeyedRecord *r = &w->keyed_out[i];
        PyObject *item;
        if (r->has_key)
            item = Py_BuildValue("(iLy#NLL)", r->delta, (long long)r->timestamp,
                                 (const char *)r->digest, (Py_ssize_t)16,
                                 PyBool_FromLong(r->tombstone), (long long)r->body_pos,
                                 (long long)r->end_pos);
        else
            item = Py_BuildValue("(iLONLL)", r->delta, (long long)r->timestamp, Py_None,
                                 PyBool_FromLong(r->tombstone), (long long)r->body_pos,
                                 (long long)r->end_pos);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *
Walker_feed(Walker *w, PyObject *arg)
{
    Py_buffer view;
    if (w->failed) {
        PyErr_SetString(RecordError, w->error);
        return NULL;
    }
    if (w->busy) {
        PyErr_SetString(PyExc_RuntimeError, "walker in use by another thread");
        return NULL;
    }
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int status;
    w->busy = 1;
    w->col_len = 0;
    w->keyed_len = 0;
    if (w->release_gil && view.len >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        status = walk(w, (const uint8_t *)view.buf, view.len);
        Py_END_ALLOW_THREADS
    } else {
        status = walk(w, (const uint8_t *)view.buf, view.len);
    }
    w->chunk_base += view.len;
    w->busy = 0;
    PyBuffer_Release(&view);
    if (status == -2)
        return PyErr_NoMemory();
    if (status == -1) {
        w->failed = 1;
        PyErr_SetString(RecordError, w->error);
        return NULL;
    }
    if (w->keyed)
        return keyed_list(w);
    if (!w->collect)
        Py_RETURN_NONE;
    PyObject *list = PyList_New(w->col_len);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < w->col_len; i++) {
        PyObject *item = Py_BuildValue("(iL)", w->col_delta[i], (long long)w->col_ts[i]);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *
Walker_finish(Walker *w, PyObject *Py_UNUSED(ignored))
{
    if (w->failed) {
        PyErr_SetString(RecordError, w->error);
        return NULL;
    }
    if (w->found)
        Py_RETURN_NONE;
    if (w->done != w->count || w->phase != P_LENGTH || w->carry_len != 0) {
        w->failed = 1;
        snprintf(w->error, sizeof w->error,
                 "the batch declares %d records but its data ends inside record %d", w->count,
                 w->done);
        PyErr_SetString(RecordError, w->error);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
Walker_get_records(Walker *w, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(w->done);
}

static PyObject *
Walker_get_max_timestamp(Walker *w, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(w->max_timestamp);
}

static PyObject *
Walker_get_found(Walker *w, void *Py_UNUSED(closure))
{
    if (!w->found)
        Py_RETURN_NONE;
    return Py_BuildValue("(iL)", w->found_delta, (long long)w->found_ts);
}

static PyObject *
Walker_get_bad_timestamps(Walker *w, void *Py_UNUSED(closure))
{
    PyObject *list = PyList_New(w->bad_len);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < w->bad_len; i++) {
        PyObject *item = Py_BuildValue("(iL)", w->bad_index[i], (long long)w->bad_ts[i]);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *
Walker_get_bad_timestamp_count(Walker *w, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(w->bad_count);
}

static PyObject *
Walker_get_keyless(Walker *w, void *Py_UNUSED(closure))
{
    PyObject *list = PyList_New(w->bad_key_len);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < w->bad_key_len; i++) {
        PyObject *item = PyLong_FromLong(w->bad_key_index[i]);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *
Walker_get_keyless_count(Walker *w, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(w->bad_key_count);
}

static PyObject *
Walker_get_position(Walker *w, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(w->chunk_base);
}

static PyMethodDef Walker_methods[] = {
    {"feed", (PyCFunction)Walker_feed, METH_O,
     "feed(chunk) -> list | None: walk the next bytes of the records. Raises RecordError. "
     "With collect=True, returns the (offset delta, timestamp) of each record begun in it; "
     "with key_seed, the (offset delta, timestamp, key digest or None, value is null, "
     "stream position of its offset delta, stream position of its end) of each record "
     "ended in it."},
    {"finish", (PyCFunction)Walker_finish, METH_NOARGS,
     "finish(): the data has ended; raises RecordError unless every declared record was whole."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Walker_getset[] = {
    {"records", (getter)Walker_get_records, NULL, "records walked so far", NULL},
    {"max_timestamp", (getter)Walker_get_max_timestamp, NULL,
     "the largest record timestamp seen, -1 if none", NULL},
    {"found", (getter)Walker_get_found, NULL,
     "(offset delta, timestamp) of the first record at or after the target, or None", NULL},
    {"bad_timestamps", (getter)Walker_get_bad_timestamps, NULL,
     "(record index, timestamp) of the first max_errors records outside timestamp_range", NULL},
    {"bad_timestamp_count", (getter)Walker_get_bad_timestamp_count, NULL,
     "how many records fell outside timestamp_range", NULL},
    {"keyless", (getter)Walker_get_keyless, NULL,
     "with require_keys, the index of each of the first max_errors records without a key "
     "(a record so named is not also in bad_timestamps)", NULL},
    {"keyless_count", (getter)Walker_get_keyless_count, NULL,
     "with require_keys, how many records had no key", NULL},
    {"position", (getter)Walker_get_position, NULL,
     "how many bytes have been fed so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tablets._records.RecordWalker",
    .tp_doc = "RecordWalker(count, base_timestamp, contiguous=True, timestamp_range=None, "
              "max_errors=0, target=None, min_delta=0, collect=False, release_gil=False, "
              "require_keys=False, key_seed=None)",
    .tp_basicsize = sizeof(Walker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Walker_init,
    .tp_dealloc = (destructor)Walker_dealloc,
    .tp_methods = Walker_methods,
    .tp_getset = Walker_getset,
};

/* ------------------------------------------------------------------------
 * check_batch: the produce path's per-batch checks in one call.
 *
 * validate.check_header and, for a batch the event loop checks itself
 * (uncompressed, at most INLINE_RECORDS records), validate.check_records are
 * several Python steps per batch: the header parse (batch.parse_batches),
 * the one-batch and base-offset checks, the size limit, the CRC-32C, the
 * count, control and sequence checks, then a RecordWalker built, fed and
 * finished. Here they are one C call that either accepts the batch or names
 * the first check it failed (CHECK_* below). It never builds an error: on
 * any failure validate.py runs the Python checks, which raise exactly what
 * they always did (so the two must accept the same batches: tests prove it
 * on the same inputs).
 */
#define CHECK_PARSE 1        /* the header does not parse (parse_batches raises) */
#define CHECK_NOT_ONE 2      /* not exactly one batch */
#define CHECK_BASE_OFFSET 3  /* base offset not 0 */
#define CHECK_TOO_LARGE 4    /* larger than max.message.bytes */
#define CHECK_CRC 5          /* CRC-32C mismatch */
#define CHECK_COUNT 6        /* last offset delta, record count */
#define CHECK_CONTROL 7      /* a control batch */
#define CHECK_SEQUENCE 8     /* a producer id without a sequence */
#define CHECK_RECORDS 9      /* the records (walk, timestamps, keys), or segment.bytes */
#define INLINE_RECORDS 4096  /* validate.INLINE_RECORDS */
#define BATCH_HEADER 61

static uint32_t crc32c_table[8][256];

static void
crc32c_init_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc32c_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc32c_table[t][i] = (crc32c_table[t - 1][i] >> 8) ^
                                 crc32c_table[0][crc32c_table[t - 1][i] & 0xff];
}

/* Slicing-by-8, for CPUs without the SSE 4.2 instruction. */
static uint32_t
crc32c_software(uint32_t crc, const uint8_t *p, Py_ssize_t n)
{
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        word = __builtin_bswap64(word);
#endif
        word ^= crc;
        crc = crc32c_table[7][word & 0xff] ^ crc32c_table[6][(word >> 8) & 0xff] ^
              crc32c_table[5][(word >> 16) & 0xff] ^ crc32c_table[4][(word >> 24) & 0xff] ^
              crc32c_table[3][(word >> 32) & 0xff] ^ crc32c_table[2][(word >> 40) & 0xff] ^
              crc32c_table[1][(word >> 48) & 0xff] ^ crc32c_table[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n-- > 0)
        crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t
crc32c_hardware(uint32_t crc, const uint8_t *p, Py_ssize_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n-- > 0)
        c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}
static int have_sse42;
#endif

/* CRC-32C (Castagnoli) of n bytes, as Kafka's batch CRC. */
static uint32_t
crc32c(const uint8_t *p, Py_ssize_t n)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_sse42)
        return ~crc32c_hardware(0xFFFFFFFFu, p, n);
#endif
    return ~crc32c_software(0xFFFFFFFFu, p, n);
}

static inline int64_t
be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return (int64_t)v;
}

static inline int32_t
be32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
}

static inline int16_t
be16(const uint8_t *p)
{
    return (int16_t)((uint16_t)p[0] << 8 | p[1]);
}

static inline void
put_be64(uint8_t *p, int64_t value)
{
    uint64_t v = (uint64_t)value;
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

static inline void
put_be32(uint8_t *p, int32_t value)
{
    uint32_t v = (uint32_t)value;
    for (int i = 3; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

/* The record checks validate.check_records makes of an uncompressed batch
 * that passes them all: 0 and its largest record timestamp, else -1. */
static int
walk_records(const uint8_t *body, Py_ssize_t n, int32_t count, int64_t base_timestamp,
             int check_timestamps, int64_t lo, int64_t hi, int require_keys,
             int64_t *max_timestamp)
{
    Walker w;
    memset(&w, 0, sizeof w);
    w.count = count;
    w.base_timestamp = base_timestamp;
    w.contiguous = 1;
    w.check_timestamps = check_timestamps;
    w.min_timestamp = lo;
    w.max_timestamp_allowed = hi;
    w.require_keys = require_keys;
    w.max_timestamp = -1;
    w.phase = P_LENGTH;
    /* max_errors 0: a bad timestamp or a missing key is counted, never listed. */
    if (walk(&w, body, n) != 0)
        return -1;
    if (w.done != w.count || w.phase != P_LENGTH || w.carry_len != 0)
        return -1;
    if (w.bad_count != 0 || w.bad_key_count != 0)
        return -1;
    *max_timestamp = w.max_timestamp;
    return 0;
}

static PyObject *
check_batch(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "check_batch(records, header_type, max_message_bytes, segment_bytes, "
                        "timestamp_difference_max_ms, now_ms, log_append_time, require_keys)");
        return NULL;
    }
    long long max_message_bytes = PyLong_AsLongLong(args[2]);
    long long segment_bytes = PyLong_AsLongLong(args[3]);
    long long limit = PyLong_AsLongLong(args[4]);
    long long now_ms = PyLong_AsLongLong(args[5]);
    int log_append_time = PyObject_IsTrue(args[6]);
    int require_keys = PyObject_IsTrue(args[7]);
    if (PyErr_Occurred() || log_append_time < 0 || require_keys < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *p = view.buf;
    Py_ssize_t n = view.len;
    long code = 0;
    int64_t walked = 0;
    int walked_ok = 0;
    /* batch.parse_batches: the first header */
    if (n < BATCH_HEADER || p[16] != 2) {
        code = CHECK_PARSE;
        goto done;
    }
    int32_t batch_length = be32(p + 8);
    int16_t attributes = be16(p + 21);
    if (batch_length < BATCH_HEADER - 12 || (int64_t)batch_length + 12 > (int64_t)n ||
        (attributes & 7) > 4) {
        code = CHECK_PARSE;
        goto done;
    }
    Py_ssize_t size = (Py_ssize_t)batch_length + 12;
    int64_t base_offset = be64(p);
    int32_t last_delta = be32(p + 23);
    int64_t base_timestamp = be64(p + 27);
    int64_t max_timestamp = be64(p + 35);
    int64_t producer_id = be64(p + 43);
    int16_t producer_epoch = be16(p + 51);
    int32_t base_sequence = be32(p + 53);
    int32_t record_count = be32(p + 57);
    /* validate.check_header, in its order */
    if (size != n) {
        code = CHECK_NOT_ONE;
        goto done;
    }
    if (base_offset != 0) {
        code = CHECK_BASE_OFFSET;
        goto done;
    }
    if ((long long)size > max_message_bytes) {
        code = CHECK_TOO_LARGE;
        goto done;
    }
    if (crc32c(p + 21, size - 21) != (uint32_t)be32(p + 17)) {
        code = CHECK_CRC;
        goto done;
    }
    if (last_delta < 0 || record_count <= 0 || (int64_t)record_count != (int64_t)last_delta + 1) {
        code = CHECK_COUNT;
        goto done;
    }
    if (attributes & 0x20) {
        code = CHECK_CONTROL;
        goto done;
    }
    if (producer_id >= 0 && base_sequence < 0) {
        code = CHECK_SEQUENCE;
        goto done;
    }
    /* validate.check_records, when validate.runs_inline */
    if ((attributes & 7) == 0 && record_count <= INLINE_RECORDS) {
        if (attributes & 0x08) { /* the producer set LogAppendTime: refused */
            code = CHECK_RECORDS;
            goto done;
        }
        /* validate._timestamp_window, saturating as its max/min do */
        int check_timestamps = !log_append_time && limit < INT64_MAX;
        int64_t lo = 0, hi = 0;
        if (check_timestamps) {
            if (__builtin_sub_overflow((int64_t)now_ms, (int64_t)limit, &lo))
                lo = INT64_MIN;
            if (__builtin_add_overflow((int64_t)now_ms, (int64_t)limit, &hi))
                hi = INT64_MAX;
        }
        if (walk_records(p + BATCH_HEADER, size - BATCH_HEADER, record_count, base_timestamp,
                         check_timestamps, lo, hi, require_keys, &walked) < 0 ||
            (long long)size > segment_bytes) {
            code = CHECK_RECORDS;
            goto done;
        }
        walked_ok = 1;
    }
done:
    PyBuffer_Release(&view);
    if (code != 0)
        return PyLong_FromLong(code);
    PyObject *fields[11];
    fields[0] = PyLong_FromLong(0); /* start */
    fields[1] = PyLong_FromSsize_t(size);
    fields[2] = PyLong_FromLongLong(base_offset);
    fields[3] = PyLong_FromLong(attributes);
    fields[4] = PyLong_FromLong(last_delta);
    fields[5] = PyLong_FromLongLong(base_timestamp);
    fields[6] = PyLong_FromLongLong(max_timestamp);
    fields[7] = PyLong_FromLongLong(producer_id);
    fields[8] = PyLong_FromLong(producer_epoch);
    fields[9] = PyLong_FromLong(base_sequence);
    fields[10] = PyLong_FromLong(record_count);
    PyObject *header = NULL;
    int ok = 1;
    for (int i = 0; i < 11; i++)
        ok &= fields[i] != NULL;
    if (ok)
        header = PyObject_Vectorcall(args[1], fields, 11, NULL);
    for (int i = 0; i < 11; i++)
        Py_XDECREF(fields[i]);
    if (header == NULL)
        return NULL;
    PyObject *timestamp = walked_ok ? PyLong_FromLongLong(walked) : Py_NewRef(Py_None);
    if (timestamp == NULL) {
        Py_DECREF(header);
        return NULL;
    }
    PyObject *result = PyTuple_Pack(2, header, timestamp);
    Py_DECREF(header);
    Py_DECREF(timestamp);
    return result;
}

static PyObject *
stamp(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "stamp(records, size, base_offset, leader_epoch)");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    long long base_offset = PyLong_AsLongLong(args[2]);
    long leader_epoch = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (leader_epoch < INT32_MIN || leader_epoch > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "leader_epoch is an int32");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (size < 16 || size > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "size must be between 16 and the buffer's length");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out != NULL) {
        uint8_t *q = (uint8_t *)PyBytes_AS_STRING(out);
        memcpy(q, view.buf, (size_t)size);
        put_be64(q, base_offset);
        put_be32(q + 12, (int32_t)leader_epoch);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyObject *
crc32c_py(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc = crc32c(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef module_methods[] = {
    {"check_batch", (PyCFunction)(void (*)(void))check_batch, METH_FASTCALL,
     "check_batch(records, header_type, max_message_bytes, segment_bytes, "
     "timestamp_difference_max_ms, now_ms, log_append_time, require_keys) -> "
     "(header, max record timestamp or None) | int: validate.check_header's checks and, "
     "for a batch validate.runs_inline accepts, check_records', in one call; the header "
     "built as header_type(start, size, base_offset, attributes, last_offset_delta, "
     "base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, "
     "record_count); None when the records are left to check_records. An int names the "
     "first check that failed (CHECK_*): the Python checks then raise its error."},
    {"stamp", (PyCFunction)(void (*)(void))stamp, METH_FASTCALL,
     "stamp(records, size, base_offset, leader_epoch) -> bytes: the first size bytes "
     "with the base offset and leader epoch set (one copy)."},
    {"crc32c", (PyCFunction)crc32c_py, METH_O, "crc32c(data) -> int: CRC-32C (Castagnoli)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef records_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tablets._records",
    .m_doc = "Streaming, bounded checks of the records of Kafka v2 record batches.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__records(void)
{
    if (PyType_Ready(&WalkerType) < 0)
        return NULL;
    crc32c_init_table();
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
    PyObject *module = PyModule_Create(&records_module);
    if (module == NULL)
        return NULL;
    RecordError = PyErr_NewException("tablets._records.RecordError", PyExc_ValueError, NULL);
    if (RecordError == NULL || PyModule_AddObjectRef(module, "RecordError", RecordError) < 0 ||
        PyModule_AddObjectRef(module, "RecordWalker", (PyObject *)&WalkerType) < 0 ||
        PyModule_AddIntConstant(module, "CHECK_PARSE", CHECK_PARSE) < 0 ||
        PyModule_AddIntConstant(module, "CHECK_NOT_ONE", CHECK_NOT_ONE) < 0 ||
        PyModule_AddIntConstant(module, "CHECK_BASE_OFFSET", CHECK_BASE_OFFSET) < 0 ||
        PyModule_AddIntConstant(module, "CHECK_TOO_LARGE", CHECK_TOO_LARGE) < 0 ||
        PyModule_AddIntConstant(module, "CHECK_CRC", CHECK_CRC) < 0 ||
        PyModule_AddIntConstant(module, "CHECK_COUNT", CHECK_COUNT) < 0 ||
        PyModule_AddIntConstant(module, "CHECK_CONTROL", CHECK_CONTROL) < 0 ||
        PyModule_AddIntConstant(module, "CHECK_SEQUENCE", CHECK_SEQUENCE) < 0 ||
        PyModule_AddIntConstant(module, "CHECK_RECORDS", CHECK_RECORDS) < 0 ||
        PyModule_AddIntConstant(module, "INLINE_RECORDS", INLINE_RECORDS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
