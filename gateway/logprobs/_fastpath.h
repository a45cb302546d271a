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

/* How many ASCII digits (0-8) the 8 bytes at p start with, and their value in *value. A byte is a digit when
 * its high nibble is 3 and adding 6 does not carry into it; the first one that is not is the lowest flagged
 * byte (a carry out of a later byte never reaches an earlier one). The digits are moved to the top of the
 * word, zeros below them, and combined pairwise (x10 + next), then the pairs (x100), then the quads (x10000). */
static inline int
leading_digits(const unsigned char *p, uint32_t *value)
{
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    (void)p, (void)value;
    return 0;
#else
    uint64_t word;
    memcpy(&word, p, sizeof word); /* p[0] is the lowest byte */
    uint64_t other = ((word & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL)
                     | (((word + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL);
    int count = other == 0 ? 8 : __builtin_ctzll(other) / 8;
    if (count == 0) {
        return 0;
    }
    word -= 0x3030303030303030ULL; /* the first `count` bytes are digits: no borrow out of them */
    word <<= 8 * (8 - count);      /* (a shift by 64 is undefined: count 8 shifts by 0) */
    word = (word * 10 + (word >> 8)) & 0x00FF00FF00FF00FFULL;
    word = (word * 100 + (word >> 16)) & 0x0000FFFF0000FFFFULL;
    word = word * 10000 + (word >> 32);
    *value = (uint32_t)word;
    return count;
#endif
}

/* The digits at p, up to the first non-digit, appended to *digits (a decimal reader's significant digits:
 * leading zeros not counted in *significant): past the leading zeros and the first significant digit, up to
 * eight at a time (leading_digits; a float32 printed in full is 16-17 digits: one digit at a time was ~110
 * instructions a logprob), then one at a time near the end of the text. Where the digits end, or NULL past
 * 19 significant digits (the reader then leaves the number to Python's). */
static inline const unsigned char *
take_digits(const unsigned char *p, const unsigned char *end, uint64_t *digits, int *significant)
{
    static const uint64_t scale[9] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
                                      100000000ULL};
    uint64_t value = *digits;
    int count = *significant;
    for (; value == 0 && p < end && (unsigned int)(*p - '0') <= 9; p++) {
        value = (unsigned int)(*p - '0');
        count = value != 0;
    }
    uint32_t chunk;
    int taken;
    while (value != 0 && end - p >= 8 && (taken = leading_digits(p, &chunk)) > 0) {
        if (count + taken > 19) {
            return NULL;
        }
        value = value * scale[taken] + chunk;
        count += taken;
        p += taken;
        if (taken < 8) {
            break; /* the digits end here */
        }
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
