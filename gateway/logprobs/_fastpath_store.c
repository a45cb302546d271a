/* The response store's column scanner: gateway/store/codec.py's `columns(raw)`, compiled.
 *
 * fp_store_columns(raw) returns exactly what columns(raw) returns (the parts of the compact form and the
 * float kind), in one pass over the JSON bytes instead of two regex passes and a Python call per list,
 * or None when the value is not the common case, and the Python code then decides all of it:
 *   - a `"logprobs":` followed by a number anywhere (the Python code then keeps the whole value as JSON);
 *   - a key (token string, byte values) of a list of the usual shape that the Python code would refuse
 *     (byte values not canonical, or the token not the bytes as render_responses spells them): it keeps
 *     that list as JSON, which needs its table bookkeeping;
 *   - more than 255 alternatives in an entry (the Python code keeps the whole value as JSON).
 * A list matches here exactly when codec._LIST matches it: the same grammar, parsed by hand (every
 * piece of the pattern is unambiguous, so the regex cannot backtrack into another reading of it).
 * tests/test_store_codec.py holds the two equal, byte for byte, over rendered Responses and mutations.
 */
#include "_fastpath.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

typedef const unsigned char *Cursor;

/* A growable array of fixed-size items. */
typedef struct {
    char *data;
    Py_ssize_t count, capacity;
    size_t item;
} Column;

static int
column_reserve(Column *column, Py_ssize_t more)
{
    if (column->count + more <= column->capacity) {
        return 0;
    }
    Py_ssize_t capacity = column->capacity ? column->capacity * 2 : 64;
    while (capacity < column->count + more) {
        capacity *= 2;
    }
    char *data = PyMem_Realloc(column->data, (size_t)capacity * column->item);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    column->data = data;
    column->capacity = capacity;
    return 0;
}

#define COLUMN(type) {NULL, 0, 0, sizeof(type)}
#define AT(column, type, i) (((type *)(column).data)[i])

static int
column_append(Column *column, const void *value)
{
    if (column_reserve(column, 1) < 0) {
        return -1;
    }
    memcpy(column->data + (size_t)column->count * column->item, value, column->item);
    column->count++;
    return 0;
}

static PyObject *
column_bytes(const Column *column)
{
    return PyBytes_FromStringAndSize(column->data, column->count * (Py_ssize_t)column->item);
}

/* --- the grammar of codec._LIST ------------------------------------------------------------------ */

/* One entry or alternative: spans of raw. */
typedef struct {
    Cursor token; /* the token's JSON string, quotes included */
    Py_ssize_t token_length;
    Cursor number;
    Py_ssize_t number_length;
    Cursor bytes; /* the byte values' text, between the brackets */
    Py_ssize_t bytes_length;
    int head; /* an entry (its alternatives follow), not an alternative */
} Item;

static inline Cursor
literal(Cursor p, Cursor end, const char *text, Py_ssize_t length)
{
    return (end - p >= length && memcmp(p, text, (size_t)length) == 0) ? p + length : NULL;
}

#define LITERAL(p, end, text) literal((p), (end), (text), (Py_ssize_t)sizeof(text) - 1)

static inline int
is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static inline Cursor
digits(Cursor p, Cursor end)
{
    if (p >= end || !is_digit(*p)) {
        return NULL;
    }
    while (p < end && is_digit(*p)) {
        p++;
    }
    return p;
}

/* _STR: "(?:[^"\\]|\\.)*" where `.` is any byte but a newline. */
static Cursor
pass_string(Cursor p, Cursor end)
{
    if (p >= end || *p != '"') {
        return NULL;
    }
    for (p++; p < end; p++) {
        if (*p == '"') {
            return p + 1;
        }
        if (*p == '\\') {
            if (p + 1 >= end || p[1] == '\n') {
                return NULL;
            }
            p++;
        }
    }
    return NULL;
}

/* _NUM: -?\d+(?:\.\d+(?:e[-+]?\d+)?|e[-+]?\d+). Always followed by `,` in the grammar, so an exponent
 * that does not parse fails the whole item, as it fails the regex. */
static Cursor
pass_number(Cursor p, Cursor end)
{
    if (p < end && *p == '-') {
        p++;
    }
    if ((p = digits(p, end)) == NULL || p >= end) {
        return NULL;
    }
    int exponent = *p == 'e';
    if (*p == '.') {
        if ((p = digits(p + 1, end)) == NULL) {
            return NULL;
        }
        exponent = p < end && *p == 'e';
    }
    else if (!exponent) {
        return NULL; /* an integer */
    }
    if (exponent) {
        p++;
        if (p < end && (*p == '-' || *p == '+')) {
            p++;
        }
        p = digits(p, end);
    }
    return p;
}

/* {"token":_STR,"logprob":_NUM,"bytes":_BYTES: what an entry and an alternative start with. */
static Cursor
pass_item(Cursor p, Cursor end, Item *item)
{
    if ((p = LITERAL(p, end, "{\"token\":")) == NULL) {
        return NULL;
    }
    item->token = p;
    if ((p = pass_string(p, end)) == NULL) {
        return NULL;
    }
    item->token_length = p - item->token;
    if ((p = LITERAL(p, end, ",\"logprob\":")) == NULL) {
        return NULL;
    }
    item->number = p;
    if ((p = pass_number(p, end)) == NULL) {
        return NULL;
    }
    item->number_length = p - item->number;
    if ((p = LITERAL(p, end, ",\"bytes\":[")) == NULL) {
        return NULL;
    }
    item->bytes = p;
    if (p < end && *p != ']') {
        while ((p = digits(p, end)) != NULL && p < end && *p == ',') {
            p++;
        }
        if (p == NULL) {
            return NULL;
        }
    }
    item->bytes_length = p - item->bytes;
    return LITERAL(p, end, "]");
}

/* The entries of the list that opens at `p` (its `[`), into `items`; past its `]`, or NULL (not the
 * usual shape: the items taken so far are dropped). */
static Cursor
pass_list(Cursor p, Cursor end, Column *items)
{
    items->count = 0;
    p++;
    for (;;) {
        Item item;
        if (column_reserve(items, 1) < 0 || (p = pass_item(p, end, &item)) == NULL
            || (p = LITERAL(p, end, ",\"top_logprobs\":[")) == NULL) {
            return NULL;
        }
        item.head = 1;
        column_append(items, &item);
        if (p < end && *p != ']') {
            for (;;) {
                if (column_reserve(items, 1) < 0 || (p = pass_item(p, end, &item)) == NULL
                    || (p = LITERAL(p, end, "}")) == NULL) {
                    return NULL;
                }
                item.head = 0;
                column_append(items, &item);
                if (p >= end || *p != ',') {
                    break;
                }
                p++;
            }
        }
        if ((p = LITERAL(p, end, "]}")) == NULL || p >= end) {
            return NULL;
        }
        if (*p == ']') {
            return p + 1;
        }
        if (*p != ',') {
            return NULL;
        }
        p++;
    }
}

/* --- the token table ------------------------------------------------------------------------------ */

typedef struct {
    Cursor token;
    Py_ssize_t token_length;
    Cursor bytes;
    Py_ssize_t bytes_length;
    uint64_t hash;
    int text; /* the bytes are valid UTF-8: the table keeps them as the token's text */
} Key;

typedef struct {
    Column keys;      /* Key, in first-seen order */
    uint32_t *slots;  /* open addressing: a key's index + 1, or 0 */
    Py_ssize_t mask;
    unsigned char *data; /* scratch: one key's bytes, then its rendering */
    Py_ssize_t data_capacity;
} Table;

/* Eight bytes at a time (a byte at a time was a fifth of the scan); the last shift brings the high bits,
 * where a product mixes, down to the slot bits. */
static inline uint64_t
hash_span(uint64_t hash, Cursor p, Py_ssize_t n)
{
    uint64_t word;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&word, p, 8);
        hash = (hash ^ word) * 0x9e3779b97f4a7c15ULL;
        hash ^= hash >> 29;
    }
    word = (uint64_t)n << 56;
    memcpy(&word, p, (size_t)n); /* the low n bytes (little-endian; on others merely another hash) */
    hash = (hash ^ word) * 0x9e3779b97f4a7c15ULL;
    return hash ^ (hash >> 32);
}

static int
table_grow(Table *table)
{
    Py_ssize_t size = table->mask ? (table->mask + 1) * 2 : 1024;
    uint32_t *slots = PyMem_Calloc((size_t)size, sizeof(uint32_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < table->keys.count; i++) {
        Py_ssize_t slot = (Py_ssize_t)(AT(table->keys, Key, i).hash & (uint64_t)(size - 1));
        while (slots[slot] != 0) {
            slot = (slot + 1) & (size - 1);
        }
        slots[slot] = (uint32_t)(i + 1);
    }
    PyMem_Free(table->slots);
    table->slots = slots;
    table->mask = size - 1;
    return 0;
}

/* Whether codec._Columns._add accepts the key: canonical byte values (no leading zero, none past 255) and
 * the token exactly their render_responses spelling; sets key->text. -1 on an error (set). */
static int
key_is_usual(Table *table, Key *key)
{
    /* Room for the bytes (a value takes at least a digit and a comma) and their rendering past them. */
    Py_ssize_t most = key->bytes_length / 2 + 1;
    if (6 * most + 2 > table->data_capacity) {
        Py_ssize_t capacity = 6 * most + 2;
        unsigned char *data = PyMem_Realloc(table->data, (size_t)capacity);
        if (data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        table->data = data;
        table->data_capacity = capacity;
    }
    unsigned char *data = table->data;
    Py_ssize_t n = 0;
    Cursor p = key->bytes, end = key->bytes + key->bytes_length;
    while (p < end) {
        Cursor start = p;
        unsigned int value = 0;
        while (p < end && *p != ',') {
            value = value * 10 + (unsigned int)(*p++ - '0');
            if (p - start > 3) {
                return 0;
            }
        }
        if (value > 255 || (*start == '0' && p - start > 1)) {
            return 0;
        }
        data[n++] = (unsigned char)value;
        p += p < end;
    }
    key->text = utf8_valid(data, n);
    unsigned char *rendered = data + n;
    Py_ssize_t rendered_length = (unsigned char *)fp_write_token_string((char *)rendered, data, n) - rendered;
    return rendered_length == key->token_length && memcmp(rendered, key->token, (size_t)rendered_length) == 0;
}

/* The index of the item's key in the table, added (and checked) when new; -2 when the Python code would
 * refuse it, -1 on an error (set). */
static Py_ssize_t
table_index(Table *table, const Item *item)
{
    if (2 * (table->keys.count + 1) > table->mask + 1 && table_grow(table) < 0) {
        return -1;
    }
    uint64_t hash = hash_span(hash_span(0, item->token, item->token_length), item->bytes,
                              item->bytes_length);
    Py_ssize_t slot = (Py_ssize_t)(hash & (uint64_t)table->mask);
    for (; table->slots[slot] != 0; slot = (slot + 1) & table->mask) {
        Py_ssize_t index = table->slots[slot] - 1;
        const Key *key = &AT(table->keys, Key, index);
        if (key->hash == hash && key->token_length == item->token_length && key->bytes_length == item->bytes_length
            && memcmp(key->token, item->token, (size_t)item->token_length) == 0
            && memcmp(key->bytes, item->bytes, (size_t)item->bytes_length) == 0) {
            return index;
        }
    }
    Key key = {item->token, item->token_length, item->bytes, item->bytes_length, hash, 0};
    int usual = key_is_usual(table, &key);
    if (usual <= 0) {
        return usual < 0 ? -1 : -2;
    }
    if (table->keys.count >= UINT32_MAX - 1 || column_append(&table->keys, &key) < 0) {
        return -1;
    }
    table->slots[slot] = (uint32_t)table->keys.count;
    return table->keys.count - 1;
}

/* orjson.dumps([_plain(data) for data in the table]): a valid UTF-8 key is its token string (the token is
 * the text, checked), any other its byte values (canonical, checked). */
static PyObject *
table_json(const Table *table)
{
    Py_ssize_t size = 2;
    for (Py_ssize_t i = 0; i < table->keys.count; i++) {
        const Key *key = &AT(table->keys, Key, i);
        size += 1 + (key->text ? key->token_length : key->bytes_length + 2);
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL) {
        return NULL;
    }
    char *out = PyBytes_AS_STRING(result);
    *out++ = '[';
    for (Py_ssize_t i = 0; i < table->keys.count; i++) {
        const Key *key = &AT(table->keys, Key, i);
        if (i > 0) {
            *out++ = ',';
        }
        if (key->text) {
            memcpy(out, key->token, (size_t)key->token_length);
            out += key->token_length;
        }
        else {
            *out++ = '[';
            memcpy(out, key->bytes, (size_t)key->bytes_length);
            out += key->bytes_length;
            *out++ = ']';
        }
    }
    *out++ = ']';
    if (_PyBytes_Resize(&result, out - PyBytes_AS_STRING(result)) < 0) {
        return NULL;
    }
    return result;
}

/* --- the float column (codec._floats) ---------------------------------------------------------------- */

/* float(text) for a _NUM (what Python's reader gives). -1 on an error (set). */
static int
parse_number(const Item *item, double *value)
{
    if (fp_read_decimal(item->number, item->number + item->number_length, value)) {
        return 0;
    }
    char *stop;
    *value = PyOS_string_to_double((const char *)item->number, &stop, NULL); /* stops at the `,` after it */
    if (*value == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    if ((Cursor)stop != item->number + item->number_length) {
        PyErr_SetString(PyExc_ValueError, "a logprob the store scanner could not read");
        return -1;
    }
    return 0;
}

static inline int
same_double(double a, double b)
{
    return memcmp(&a, &b, sizeof(double)) == 0; /* bits compared: a -0.0 must stay one */
}

/* The int round(x) gives (float.__round__: half to even), as a double; an int has no -0. */
static inline double
python_round(double x)
{
    double rounded = round(x);
    if (fabs(x - rounded) == 0.5) {
        rounded = 2.0 * round(x / 2.0);
    }
    return rounded + 0.0;
}

/* codec._floats: the column's bytes and its kind (4: float32, 16 + d: int32 units of 10^-d, 32 + d: int64
 * units, 8: float64). */
PyObject *
fp_float_column(const double *values, Py_ssize_t count, int *kind)
{
    Py_ssize_t i = 0;
    for (; i < count && same_double((double)(float)values[i], values[i]); i++) {
    }
    if (i == count) {
        *kind = 4;
        PyObject *result = PyBytes_FromStringAndSize(NULL, count * 4);
        if (result != NULL) {
            float *out = (float *)PyBytes_AS_STRING(result);
            for (i = 0; i < count; i++) {
                out[i] = (float)values[i];
            }
        }
        return result;
    }
    static const int digit_counts[] = {6, 3, 9};
    static const double scales[] = {1e6, 1e3, 1e9};
    for (int d = 0; d < 3; d++) {
        double scale = scales[d];
        int fits_int32 = 1, exact = 1;
        for (i = 0; i < count; i++) {
            double scaled = values[i] * scale;
            if (!isfinite(scaled)) {
                goto float64; /* round() raises: Python gives up on units altogether */
            }
            double unit = python_round(scaled);
            if (!same_double(unit / scale, values[i])) {
                exact = 0;
                break;
            }
            fits_int32 &= unit >= -2147483648.0 && unit <= 2147483647.0;
        }
        if (!exact) {
            continue;
        }
        int wide = !fits_int32;
        for (i = 0; wide && i < count; i++) {
            double unit = python_round(values[i] * scale);
            if (!(unit >= -9223372036854775808.0 && unit < 9223372036854775808.0)) {
                goto float64;
            }
        }
        *kind = (wide ? 32 : 16) + digit_counts[d];
        PyObject *result = PyBytes_FromStringAndSize(NULL, count * (wide ? 8 : 4));
        if (result != NULL) {
            char *out = PyBytes_AS_STRING(result);
            for (i = 0; i < count; i++) {
                double unit = python_round(values[i] * scale);
                if (wide) {
                    ((int64_t *)out)[i] = (int64_t)unit;
                }
                else {
                    ((int32_t *)out)[i] = (int32_t)unit;
                }
            }
        }
        return result;
    }
float64:
    *kind = 8;
    return PyBytes_FromStringAndSize((const char *)values, count * (Py_ssize_t)sizeof(double));
}

/* --- the scan ------------------------------------------------------------------------------------ */

static const char LOGPROBS_KEY[] = "\"logprobs\":";
#define LOGPROBS_KEY_LENGTH ((Py_ssize_t)sizeof(LOGPROBS_KEY) - 1)

/* The next `"logprobs":` at or after p, or NULL. */
static Cursor
next_logprobs(Cursor p, Cursor end)
{
    while (end - p >= LOGPROBS_KEY_LENGTH) {
        Cursor quote = memchr(p, '"', (size_t)(end - p - LOGPROBS_KEY_LENGTH + 1));
        if (quote == NULL) {
            return NULL;
        }
        if (memcmp(quote + 1, LOGPROBS_KEY + 1, (size_t)LOGPROBS_KEY_LENGTH - 1) == 0) {
            return quote;
        }
        p = quote + 1;
    }
    return NULL;
}

PyObject *
fp_store_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "store_columns(raw: bytes)");
        return NULL;
    }
    PyObject *raw = args[0];
    Cursor start = (Cursor)PyBytes_AS_STRING(raw), end = start + PyBytes_GET_SIZE(raw);
    Column skeleton = COLUMN(char), items = COLUMN(Item), list_lengths = COLUMN(uint32_t);
    Column counts = COLUMN(uint8_t), indices = COLUMN(uint32_t), values = COLUMN(double);
    Table table = {COLUMN(Key), NULL, 0, NULL, 0};
    PyObject *result = NULL, *parts[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    int kind = 4;
    Cursor copied = start; /* raw up to here is in the skeleton */
    for (Cursor at = next_logprobs(start, end); at != NULL; at = next_logprobs(at, end)) {
        Cursor value = at + LOGPROBS_KEY_LENGTH;
        if (value < end && (is_digit(*value) || (*value == '-' && value + 1 < end && is_digit(value[1])))) {
            goto python; /* codec._INT_LOGPROBS: the value is kept as it is */
        }
        Cursor after;
        if (value >= end || *value != '[' || at == start || (at[-1] != '{' && at[-1] != ',')
            || (after = pass_list(value, end, &items)) == NULL) {
            if (PyErr_Occurred()) {
                goto done;
            }
            at++;
            continue;
        }
        if (column_reserve(&indices, items.count) < 0 || column_reserve(&values, items.count) < 0) {
            goto done;
        }
        Py_ssize_t entries = 0;
        for (Py_ssize_t i = 0; i < items.count; i++) {
            const Item *item = &AT(items, Item, i);
            Py_ssize_t index = table_index(&table, item);
            if (index == -2) {
                goto python;
            }
            double number;
            if (index < 0 || parse_number(item, &number) < 0) {
                goto done;
            }
            AT(indices, uint32_t, indices.count++) = (uint32_t)index;
            AT(values, double, values.count++) = number;
            if (item->head) {
                entries++;
                Py_ssize_t count = 0;
                while (i + 1 + count < items.count && !AT(items, Item, i + 1 + count).head) {
                    count++;
                }
                uint8_t small = (uint8_t)count;
                if (count > 255) {
                    goto python;
                }
                if (column_append(&counts, &small) < 0) {
                    goto done;
                }
            }
        }
        uint32_t length = (uint32_t)entries;
        char marker[LOGPROBS_KEY_LENGTH + 24];
        int marker_length = PyOS_snprintf(marker, sizeof(marker), "\"logprobs\":%zd", list_lengths.count);
        if (column_append(&list_lengths, &length) < 0
            || column_reserve(&skeleton, (at - copied) + marker_length) < 0) {
            goto done;
        }
        memcpy(skeleton.data + skeleton.count, copied, (size_t)(at - copied));
        memcpy(skeleton.data + skeleton.count + (at - copied), marker, (size_t)marker_length);
        skeleton.count += (at - copied) + marker_length;
        copied = at = after;
    }
    if (copied == start) {
        parts[0] = Py_NewRef(raw);
    }
    else {
        if (column_reserve(&skeleton, end - copied) < 0) {
            goto done;
        }
        memcpy(skeleton.data + skeleton.count, copied, (size_t)(end - copied));
        skeleton.count += end - copied;
        parts[0] = column_bytes(&skeleton);
    }
    if (parts[0] == NULL || (parts[1] = table_json(&table)) == NULL || (parts[2] = column_bytes(&list_lengths)) == NULL
        || (parts[3] = column_bytes(&counts)) == NULL || (parts[4] = column_bytes(&indices)) == NULL
        || (parts[5] = fp_float_column((const double *)values.data, values.count, &kind)) == NULL) {
        goto done;
    }
    result = Py_BuildValue("(OOOOOOi)", parts[0], parts[1], parts[2], parts[3], parts[4], parts[5], kind);
    goto done;
python:
    if (!PyErr_Occurred()) {
        result = Py_NewRef(Py_None);
    }
done:
    for (int i = 0; i < 6; i++) {
        Py_XDECREF(parts[i]);
    }
    PyMem_Free(skeleton.data);
    PyMem_Free(items.data);
    PyMem_Free(list_lengths.data);
    PyMem_Free(counts.data);
    PyMem_Free(indices.data);
    PyMem_Free(values.data);
    PyMem_Free(table.keys.data);
    PyMem_Free(table.slots);
    PyMem_Free(table.data);
    return result;
}
