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

static struct PyModuleDef records_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tablets._records",
    .m_doc = "Streaming, bounded checks of the records of Kafka v2 record batches.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__records(void)
{
    if (PyType_Ready(&WalkerType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&records_module);
    if (module == NULL)
        return NULL;
    RecordError = PyErr_NewException("tablets._records.RecordError", PyExc_ValueError, NULL);
    if (RecordError == NULL || PyModule_AddObjectRef(module, "RecordError", RecordError) < 0 ||
        PyModule_AddObjectRef(module, "RecordWalker", (PyObject *)&WalkerType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
