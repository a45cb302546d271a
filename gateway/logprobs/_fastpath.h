/* What the compiled twins share (_fastpath.c: records and renderers; _fastpath_json.c: the body scanner). */
#ifndef RESPONSES_GATEWAY_FASTPATH_H
#define RESPONSES_GATEWAY_FASTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define SENTINEL_LOGPROB (-9999.0)
#define MAX_CANDIDATES 64 /* more alternatives than any server sends: left to Python */

/* Take a finished object out of the cycle collector. Everything built here is a tree of strings, numbers,
 * bytes and the Origin singleton: it cannot be part of a cycle, and leaving it tracked made the
 * collector walk every token and entry of every response again and again (measured: most of the
 * time of a 1,000-token response went to collections). Python code that later puts a container into
 * one of these dicts re-tracks it (CPython does that on insertion). */
static inline PyObject *
fp_untracked(PyObject *object)
{
    if (object != NULL && PyObject_GC_IsTracked(object)) {
        PyObject_GC_UnTrack(object);
    }
    return object;
}

/* Length of the well-formed UTF-8 sequence at `s` (what Python's decoder accepts), or 0. */
static inline Py_ssize_t
utf8_sequence(const unsigned char *s, Py_ssize_t available)
{
    unsigned char lead = s[0];
    Py_ssize_t length;
    unsigned char low = 0x80, high = 0xBF; /* the allowed range of the second byte */
    if (lead >= 0xC2 && lead <= 0xDF) {
        length = 2;
    }
    else if (lead >= 0xE0 && lead <= 0xEF) {
        length = 3;
        if (lead == 0xE0) {
            low = 0xA0; /* no overlong forms */
        }
        else if (lead == 0xED) {
            high = 0x9F; /* no surrogates */
        }
    }
    else if (lead >= 0xF0 && lead <= 0xF4) {
        length = 4;
        if (lead == 0xF0) {
            low = 0x90;
        }
        else if (lead == 0xF4) {
            high = 0x8F; /* nothing past U+10FFFF */
        }
    }
    else {
        return 0;
    }
    if (available < length || s[1] < low || s[1] > high) {
        return 0;
    }
    for (Py_ssize_t i = 2; i < length; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            return 0;
        }
    }
    return length;
}

/* Whether all n bytes at `s` are well-formed UTF-8 (what Python's decoder accepts). */
static inline int
utf8_valid(const unsigned char *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n;) {
        Py_ssize_t length = s[i] < 0x80 ? 1 : utf8_sequence(s + i, n - i);
        if (length == 0) {
            return 0;
        }
        i += length;
    }
    return 1;
}

/* A float strictly between the sentinel and +inf: the value every reader and renderer keeps as is. */
static inline int
plain_logprob(PyObject *value)
{
    if (value == NULL || !PyFloat_CheckExact(value)) {
        return 0;
    }
    double number = PyFloat_AS_DOUBLE(value);
    return number > SENTINEL_LOGPROB && number < Py_HUGE_VAL; /* NaN fails both */
}

/* Whether the 8 bytes at p are all ASCII digits, and if so their value in *value: each byte's digit
 * combined pairwise in one 64-bit word (x10 + next), then the pairs (x100), then the quads (x10000). */
static inline int
eight_digits(const unsigned char *p, uint32_t *value)
{
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    (void)p, (void)value;
    return 0; /* the arithmetic below reads p[0] as the lowest byte: elsewhere, one digit at a time */
#else
    uint64_t word;
    memcpy(&word, p, sizeof word); /* p[0] is the lowest byte */
    /* every byte 0x30-0x39: high nibble 3, and adding 6 does not carry into it */
    if (((word & 0xF0F0F0F0F0F0F0F0ULL) | (((word + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) >> 4))
        != 0x3333333333333333ULL) {
        return 0;
    }
    word -= 0x3030303030303030ULL;
    word = (word * 10 + (word >> 8)) & 0x00FF00FF00FF00FFULL;     /* 4 pairs: p0p1, p2p3, ... in bytes 0, 2, 4, 6 */
    word = (word * 100 + (word >> 16)) & 0x0000FFFF0000FFFFULL;  /* 2 quads in the low 16 bits of each half */
    word = word * 10000 + (word >> 32);                            /* all 8 in the low 32 bits */
    *value = (uint32_t)word;
    return 1;
#endif
}

/* The digits at p, up to the first non-digit, appended to *digits (a decimal reader's significant digits:
 * leading zeros not counted in *significant): past the leading zeros and the first significant digit,
 * eight at a time while they fit in 19 (a float32 printed in full is 16-17), then one at a time. Where the
 * digits end, or NULL past 19 significant digits (the reader then leaves the number to Python's). */
static inline const unsigned char *
take_digits(const unsigned char *p, const unsigned char *end, uint64_t *digits, int *significant)
{
    uint64_t value = *digits;
    int count = *significant;
    for (; value == 0 && p < end && (unsigned int)(*p - '0') <= 9; p++) {
        value = (unsigned int)(*p - '0');
        count = value != 0;
    }
    uint32_t eight;
    while (value != 0 && count <= 11 && end - p >= 8 && eight_digits(p, &eight)) {
        value = value * 100000000ULL + eight;
        count += 8;
        p += 8;
    }
    for (; p < end && (unsigned int)(*p - '0') <= 9; p++) {
        if (++count > 19) {
            return NULL;
        }
        value = value * 10 + (unsigned int)(*p - '0');
    }
    *digits = value;
    *significant = count;
    return p;
}

/* A Candidate / Token of Origin.TOKEN_ID (new references; borrowed arguments). */
PyObject *fp_candidate(PyObject *data, PyObject *logprob, Py_ssize_t id);
PyObject *fp_token(PyObject *data, PyObject *logprob, PyObject *top, Py_ssize_t id, int special, int top_absent);
int fp_check_ready(PyObject *table, PyObject *flags);
Py_ssize_t fp_placeholder_text(const char *text, Py_ssize_t length, PyObject *table);
char *fp_write_token_string(char *out, const unsigned char *s, Py_ssize_t n); /* writes at most 5n + 2 */
int fp_decimal_value(uint64_t digits, int decimals, int negative, double *value);
/* The double a JSON number's text [p, end) reads as (correctly rounded); 0 for a spelling left to Python. */
int fp_read_decimal(const unsigned char *p, const unsigned char *end, double *value);

#define FP_ENTRY_OVERHEAD 64 /* the keys, quotes, brackets and commas of one rendered entry */
/* byte values as JSON numbers, comma-separated, no brackets: "104,105" (writes at most 4n) */
char *fp_write_byte_values(char *out, const unsigned char *s, Py_ssize_t n);
/* The head of one rendered entry ({"token":..,"logprob":..,"bytes":[..]), and the numbers dumps wrote. */
char *fp_write_entry_head(char *out, PyObject *data, const char *number, Py_ssize_t number_length);
int fp_number_starts(PyObject *numbers, Py_ssize_t total, Py_ssize_t *starts);
void fp_write_entries(PyObject **result, Py_ssize_t count, const Py_ssize_t *kept, PyObject *const *data,
                      const char *numbers, const Py_ssize_t *starts);
PyObject *fp_entries_json(Py_ssize_t count, const Py_ssize_t *kept, PyObject *const *data, Py_ssize_t total,
                          PyObject *floats, PyObject *dumps, Py_ssize_t bound);

/* _fastpath_json.c */
PyObject *fp_read_chunk(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fp_sse_events(PyObject *module, PyObject *raw);
PyObject *fp_split_body(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* _fastpath_body.c: the TokenBatch a whole body's tokens are read into (-1: an error is set). */
PyObject *fp_batch_new(PyObject *table);
PyObject *fp_batch_new_small(PyObject *table); /* for a stream chunk's few tokens: small first arrays */
int fp_batch_alternative(PyObject *batch, Py_ssize_t id, double logprob);
int fp_batch_token(PyObject *batch, Py_ssize_t id, double logprob, int special, int top_absent,
                   Py_ssize_t alternatives_end); /* alternatives_end -1: the alternatives added so far */
int fp_body_init(PyObject *module);
PyObject *fp_token_batch(PyObject *module, PyObject *table); /* token_batch(table): an empty batch */

/* _fastpath_store.c */
PyObject *fp_store_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* codec._floats: the float column's bytes and its kind (4: float32, 16 + d / 32 + d: units, 8: float64). */
PyObject *fp_float_column(const double *values, Py_ssize_t count, int *kind);

#endif
