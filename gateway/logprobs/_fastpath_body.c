/* A whole body's tokens kept flat, from its JSON to the Response's logprob entries (see body_scan.py).
 *
 * The body reader (fp_split_body, _fastpath_json.c) fills a TokenBatch: per token its id, logprob and
 * flags, per alternative its id and logprob, in flat arrays; the bytes are the vocabulary table's own
 * objects, looked up by id. No Token or Candidate is built unless one is asked for: `batch[i]` and
 * `tokens()` give exactly the Tokens chat_from_ids / completions_from_ids would have made, for any code
 * that wants Tokens. What the non-streamed Responses path wants is two things, done here in C:
 *   spells(text): the visible (non-special) tokens' bytes are exactly the text's UTF-8 (the invariant;
 *     then the text needs no grouping: it is one group, the tokens' bytes);
 *   render_json(k, dumps): render_responses_json(visible tokens, k), byte for byte, with the alternatives
 *     normalized as normalize_candidates does (by id, best logprob first, stable, cut to k).
 * The batch holds only plain values (ids with bytes, logprobs strictly between the sentinel and +inf):
 * the reader declines anything else, so no sentinel is ever rendered here.
 * A stream's message keeps its tokens in one too (packed.PackedTokens): `append(tokens)` takes Tokens
 * whose bytes are the table's, and the closing frames' list is `render_json` of it, no Token rebuilt.
 */
#include "_fastpath.h"

#include <stdint.h>

typedef struct {
    PyObject_HEAD
    PyObject *table; /* id -> bytes */
    Py_ssize_t count, capacity;
    int32_t *ids;
    double *logprobs;
    unsigned char *flags; /* TOKEN_SPECIAL | TOKEN_TOP_ABSENT */
    Py_ssize_t *alternatives_end; /* where each token's alternatives end in the alternative arrays */
    Py_ssize_t alternative_count, alternative_capacity;
    int32_t *alternative_ids;
    double *alternative_logprobs;
    Py_ssize_t first_capacity, first_alternative_capacity; /* what the arrays first grow to */
} TokenBatch;

enum { TOKEN_SPECIAL = 1, TOKEN_TOP_ABSENT = 2 };

static PyTypeObject TokenBatchType;

PyObject *
fp_batch_new(PyObject *table)
{
    TokenBatch *batch = PyObject_New(TokenBatch, &TokenBatchType);
    if (batch == NULL) {
        return NULL;
    }
    batch->table = Py_NewRef(table);
    batch->count = batch->capacity = batch->alternative_count = batch->alternative_capacity = 0;
    batch->ids = batch->alternative_ids = NULL;
    batch->logprobs = batch->alternative_logprobs = NULL;
    batch->flags = NULL;
    batch->alternatives_end = NULL;
    batch->first_capacity = 128;
    batch->first_alternative_capacity = 512;
    return (PyObject *)batch;
}

PyObject *
fp_batch_new_small(PyObject *table)
{
    TokenBatch *batch = (TokenBatch *)fp_batch_new(table);
    if (batch != NULL) {
        batch->first_capacity = 4; /* a stream chunk: nearly always one token and its alternatives */
        batch->first_alternative_capacity = 32;
    }
    return (PyObject *)batch;
}

static void
batch_dealloc(TokenBatch *batch)
{
    Py_XDECREF(batch->table);
    PyMem_Free(batch->ids);
    PyMem_Free(batch->logprobs);
    PyMem_Free(batch->flags);
    PyMem_Free(batch->alternatives_end);
    PyMem_Free(batch->alternative_ids);
    PyMem_Free(batch->alternative_logprobs);
    PyObject_Free(batch);
}

/* Grow `*array` (of `size`-byte items) to hold `wanted`; -1 with MemoryError set when it cannot. */
static int
grow(void **array, Py_ssize_t wanted, size_t size)
{
    void *grown = PyMem_Realloc(*array, (size_t)wanted * size);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *array = grown;
    return 0;
}

/* The next capacity for `count` + `more` items: doubled (or the first one), and at least that many. */
static inline Py_ssize_t
next_capacity(Py_ssize_t capacity, Py_ssize_t first, Py_ssize_t needed)
{
    Py_ssize_t wanted = capacity ? 2 * capacity : first;
    return wanted < needed ? needed : wanted;
}

/* Room for `tokens` more tokens and `alternatives` more alternatives; -1 with MemoryError set when there is
 * none (the batch's contents unchanged). */
static int
reserve(TokenBatch *batch, Py_ssize_t tokens, Py_ssize_t alternatives)
{
    Py_ssize_t needed = batch->alternative_count + alternatives;
    if (needed > batch->alternative_capacity) {
        Py_ssize_t wanted = next_capacity(batch->alternative_capacity, batch->first_alternative_capacity, needed);
        if (grow((void **)&batch->alternative_ids, wanted, sizeof(int32_t)) < 0
            || grow((void **)&batch->alternative_logprobs, wanted, sizeof(double)) < 0) {
            return -1;
        }
        batch->alternative_capacity = wanted;
    }
    needed = batch->count + tokens;
    if (needed > batch->capacity) {
        Py_ssize_t wanted = next_capacity(batch->capacity, batch->first_capacity, needed);
        if (grow((void **)&batch->ids, wanted, sizeof(int32_t)) < 0
            || grow((void **)&batch->logprobs, wanted, sizeof(double)) < 0
            || grow((void **)&batch->flags, wanted, 1) < 0
            || grow((void **)&batch->alternatives_end, wanted, sizeof(Py_ssize_t)) < 0) {
            return -1;
        }
        batch->capacity = wanted;
    }
    return 0;
}

int
fp_batch_alternative(PyObject *object, Py_ssize_t id, double logprob)
{
    TokenBatch *batch = (TokenBatch *)object;
    if (reserve(batch, 0, 1) < 0) {
        return -1;
    }
    batch->alternative_ids[batch->alternative_count] = (int32_t)id;
    batch->alternative_logprobs[batch->alternative_count++] = logprob;
    return 0;
}

int
fp_batch_token(PyObject *object, Py_ssize_t id, double logprob, int special, int top_absent,
               Py_ssize_t alternatives_end)
{
    TokenBatch *batch = (TokenBatch *)object;
    if (reserve(batch, 1, 0) < 0) {
        return -1;
    }
    Py_ssize_t i = batch->count++;
    batch->ids[i] = (int32_t)id;
    batch->logprobs[i] = logprob;
    batch->flags[i] = (unsigned char)((special ? TOKEN_SPECIAL : 0) | (top_absent ? TOKEN_TOP_ABSENT : 0));
    batch->alternatives_end[i] = alternatives_end < 0 ? batch->alternative_count : alternatives_end;
    return 0;
}

static inline Py_ssize_t
alternatives_start(const TokenBatch *batch, Py_ssize_t i)
{
    return i == 0 ? 0 : batch->alternatives_end[i - 1];
}

static inline PyObject *
bytes_of(const TokenBatch *batch, int32_t id)
{
    return PyTuple_GET_ITEM(batch->table, id);
}

/* --- as Tokens -------------------------------------------------------------------------------------- */

static Py_ssize_t
batch_length(TokenBatch *batch)
{
    return batch->count;
}

/* Token i, as the id readers make it (new reference). */
static PyObject *
batch_token(TokenBatch *batch, Py_ssize_t i)
{
    Py_ssize_t start = alternatives_start(batch, i), end = batch->alternatives_end[i];
    PyObject *top = PyTuple_New(end - start), *value = NULL, *token = NULL;
    if (top == NULL) {
        return NULL;
    }
    for (Py_ssize_t j = start; j < end; j++) {
        PyObject *alternative_value = PyFloat_FromDouble(batch->alternative_logprobs[j]);
        if (alternative_value == NULL) {
            goto done;
        }
        int32_t id = batch->alternative_ids[j];
        PyObject *candidate = fp_candidate(bytes_of(batch, id), alternative_value, id);
        Py_DECREF(alternative_value);
        if (candidate == NULL) {
            goto done;
        }
        PyTuple_SET_ITEM(top, j - start, candidate);
    }
    fp_untracked(top);
    value = PyFloat_FromDouble(batch->logprobs[i]);
    if (value != NULL) {
        int32_t id = batch->ids[i];
        unsigned char flags = batch->flags[i];
        token = fp_token(bytes_of(batch, id), value, top, id, flags & TOKEN_SPECIAL, (flags & TOKEN_TOP_ABSENT) != 0);
    }
done:
    Py_DECREF(top);
    Py_XDECREF(value);
    return token;
}

static PyObject *
batch_item(TokenBatch *batch, Py_ssize_t i)
{
    if (i < 0 || i >= batch->count) {
        PyErr_SetString(PyExc_IndexError, "TokenBatch index out of range");
        return NULL;
    }
    return batch_token(batch, i);
}

/* tokens(visible_only=False) -> list[Token]: every token (or only those that are not special). */
static PyObject *
batch_tokens(TokenBatch *batch, PyObject *const *args, Py_ssize_t nargs)
{
    int visible_only = nargs > 0 ? PyObject_IsTrue(args[0]) : 0;
    if (visible_only < 0) {
        return NULL;
    }
    PyObject *tokens = PyList_New(0);
    if (tokens == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < batch->count; i++) {
        if (visible_only && batch->flags[i] & TOKEN_SPECIAL) {
            continue;
        }
        PyObject *token = batch_token(batch, i);
        if (token == NULL || PyList_Append(tokens, token) < 0) {
            Py_XDECREF(token);
            Py_DECREF(tokens);
            return NULL;
        }
        Py_DECREF(token);
    }
    return tokens;
}

/* --- the invariant ---------------------------------------------------------------------------------- */

/* spells(text) -> bool: the visible tokens' bytes, joined, are exactly `text` in UTF-8. */
static PyObject *
batch_spells(TokenBatch *batch, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "spells(text: str)");
        return NULL;
    }
    Py_ssize_t length;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &length);
    if (utf8 == NULL) {
        PyErr_Clear(); /* a lone surrogate: no bytes spell it */
        Py_RETURN_FALSE;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < batch->count; i++) {
        if (batch->flags[i] & TOKEN_SPECIAL) {
            continue;
        }
        PyObject *data = bytes_of(batch, batch->ids[i]);
        Py_ssize_t size = PyBytes_GET_SIZE(data);
        if (size > length - at || memcmp(PyBytes_AS_STRING(data), utf8 + at, (size_t)size) != 0) {
            Py_RETURN_FALSE;
        }
        at += size;
    }
    return PyBool_FromLong(at == length);
}

/* --- the Responses entries -------------------------------------------------------------------------- */

/* Token i's alternatives as normalize_candidates leaves them (each an index into the alternative arrays,
 * best first; duplicates of an id merged into the first, with the best logprob in `values`): how many. */
static Py_ssize_t
normalized(const TokenBatch *batch, Py_ssize_t i, Py_ssize_t k, Py_ssize_t *order, double *values)
{
    Py_ssize_t start = alternatives_start(batch, i), end = batch->alternatives_end[i], count = 0;
    if (k <= 0) {
        return 0;
    }
    for (Py_ssize_t j = start; j < end && count < MAX_CANDIDATES; j++) {
        int32_t id = batch->alternative_ids[j];
        double value = batch->alternative_logprobs[j];
        Py_ssize_t seen = -1;
        for (Py_ssize_t m = 0; m < count; m++) {
            if (batch->alternative_ids[order[m]] == id) {
                seen = m;
                break;
            }
        }
        if (seen >= 0) {
            if (value > values[seen]) {
                values[seen] = value; /* the same id: the same bytes, the better logprob */
            }
            continue;
        }
        order[count] = j;
        values[count++] = value;
    }
    /* Insertion sort, descending, stable: an element moves only past strictly smaller ones. */
    for (Py_ssize_t j = 1; j < count; j++) {
        Py_ssize_t index = order[j];
        double value = values[j];
        Py_ssize_t m = j;
        while (m > 0 && values[m - 1] < value) {
            order[m] = order[m - 1];
            values[m] = values[m - 1];
            m--;
        }
        order[m] = index;
        values[m] = value;
    }
    return count < k ? count : k;
}

/* The entries render_json writes, in writing order (each visible token, then its normalized alternatives):
 * `kept[i]` the alternatives kept of token i (-1: special, not written), each entry's bytes in `data` and
 * logprob in `values`; `*bound` grows by what rendering them may take. Returns how many entries. */
static Py_ssize_t
written_entries(const TokenBatch *batch, Py_ssize_t k, Py_ssize_t *kept, PyObject **data, double *values,
                Py_ssize_t *bound)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < batch->count; i++) {
        if (batch->flags[i] & TOKEN_SPECIAL) {
            kept[i] = -1;
            continue;
        }
        Py_ssize_t order[MAX_CANDIDATES];
        double best[MAX_CANDIDATES];
        Py_ssize_t alternatives = normalized(batch, i, k, order, best);
        kept[i] = alternatives;
        for (Py_ssize_t j = -1; j < alternatives; j++) {
            PyObject *bytes = bytes_of(batch, j < 0 ? batch->ids[i] : batch->alternative_ids[order[j]]);
            values[total] = j < 0 ? batch->logprobs[i] : best[j];
            data[total++] = bytes;
            *bound += FP_ENTRY_OVERHEAD + 10 * PyBytes_GET_SIZE(bytes);
        }
    }
    return total;
}

/* Room for written_entries: the parsed k, and arrays for every token and entry (NULL: an error is set). */
typedef struct {
    Py_ssize_t k, *kept;
    PyObject **data;
    double *values;
} Entries;

static int
entries_alloc(const TokenBatch *batch, PyObject *k_object, Entries *entries)
{
    entries->kept = NULL;
    entries->data = NULL;
    entries->values = NULL;
    if (!PyLong_CheckExact(k_object)) {
        PyErr_SetString(PyExc_TypeError, "k must be an int");
        return -1;
    }
    Py_ssize_t k = PyLong_AsSsize_t(k_object);
    if (k == -1 && PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t per_token = 1 + (k <= 0 ? 0 : (k < MAX_CANDIDATES ? k : MAX_CANDIDATES));
    Py_ssize_t slots = batch->count * per_token + 1;
    entries->k = k;
    entries->kept = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(batch->count + 1));
    entries->data = PyMem_Malloc(sizeof(PyObject *) * (size_t)slots);
    entries->values = PyMem_Malloc(sizeof(double) * (size_t)slots);
    if (entries->kept == NULL || entries->data == NULL || entries->values == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
entries_free(Entries *entries)
{
    PyMem_Free(entries->kept);
    PyMem_Free(entries->data);
    PyMem_Free(entries->values);
}

/* render_json(k, dumps) -> bytes: render_responses_json(tokens(visible_only=True), k), byte for byte. */
static PyObject *
batch_render_json(TokenBatch *batch, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "render_json(k: int, dumps)");
        return NULL;
    }
    Entries entries;
    PyObject *floats = NULL, *result = NULL;
    if (entries_alloc(batch, args[0], &entries) < 0) {
        goto done;
    }
    Py_ssize_t bound = 2;
    Py_ssize_t total = written_entries(batch, entries.k, entries.kept, entries.data, entries.values, &bound);
    if ((floats = PyList_New(total)) == NULL) {
        goto done;
    }
    for (Py_ssize_t e = 0; e < total; e++) {
        PyObject *value = PyFloat_FromDouble(entries.values[e]);
        if (value == NULL) {
            goto done;
        }
        PyList_SET_ITEM(floats, e, value);
    }
    result = fp_entries_json(batch->count, entries.kept, entries.data, total, floats, args[1], bound);
done:
    entries_free(&entries);
    Py_XDECREF(floats);
    return result;
}

/* --- the store's columns ---------------------------------------------------------------------------- */

/* store_columns(k) -> (table, list lengths, counts, indices, floats, kind) | None: the parts that
 * store.codec's scanner (fp_store_columns) finds in render_json(k)'s list, as the one list of a value,
 * without rendering it: the table of distinct byte strings in order of first appearance (orjson's JSON
 * of each as text when valid UTF-8, else its byte values), one uint32 list length, a uint8 alternatives
 * count per entry, a uint32 table index and a logprob per written entry (floats as codec._floats keeps
 * them). None for an empty list (rendered `[]`, which the scanner leaves in place). */
static PyObject *
batch_store_columns(TokenBatch *batch, PyObject *k_object)
{
    Entries entries;
    PyObject *result = NULL, *parts[5] = {NULL, NULL, NULL, NULL, NULL};
    uint32_t *slots = NULL;
    PyObject **distinct = NULL;
    if (entries_alloc(batch, k_object, &entries) < 0) {
        goto done;
    }
    Py_ssize_t bound = 0;
    Py_ssize_t total = written_entries(batch, entries.k, entries.kept, entries.data, entries.values, &bound);
    if (total == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (total >= UINT32_MAX / 2) {
        PyErr_SetString(PyExc_OverflowError, "too many entries for the store's columns");
        goto done;
    }
    Py_ssize_t visible = 0;
    for (Py_ssize_t i = 0; i < batch->count; i++) {
        visible += entries.kept[i] >= 0;
    }
    uint32_t list_length = (uint32_t)visible;
    parts[0] = PyBytes_FromStringAndSize((const char *)&list_length, sizeof(list_length));
    parts[1] = PyBytes_FromStringAndSize(NULL, visible);
    parts[2] = PyBytes_FromStringAndSize(NULL, total * (Py_ssize_t)sizeof(uint32_t));
    Py_ssize_t mask = 1;
    while (mask < 2 * total) {
        mask <<= 1;
    }
    mask -= 1;
    slots = PyMem_Calloc((size_t)mask + 1, sizeof(uint32_t)); /* table index + 1; 0: empty */
    distinct = PyMem_Malloc(sizeof(PyObject *) * (size_t)total);
    if (parts[0] == NULL || parts[1] == NULL || parts[2] == NULL || slots == NULL || distinct == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto done;
    }
    uint8_t *counts = (uint8_t *)PyBytes_AS_STRING(parts[1]);
    for (Py_ssize_t i = 0, c = 0; i < batch->count; i++) {
        if (entries.kept[i] >= 0) {
            counts[c++] = (uint8_t)entries.kept[i]; /* at most MAX_CANDIDATES */
        }
    }
    /* The table: one entry per distinct byte string (two ids may spell the same bytes), hashed by content. */
    uint32_t *indices = (uint32_t *)PyBytes_AS_STRING(parts[2]);
    Py_ssize_t table_size = 0, table_bound = 2;
    for (Py_ssize_t e = 0; e < total; e++) {
        PyObject *bytes = entries.data[e];
        Py_hash_t hash = PyObject_Hash(bytes); /* cached in the vocabulary's bytes objects */
        if (hash == -1) {
            goto done;
        }
        Py_ssize_t slot = (Py_ssize_t)((size_t)hash & (size_t)mask);
        for (; slots[slot] != 0; slot = (slot + 1) & mask) {
            PyObject *other = distinct[slots[slot] - 1];
            if (other == bytes || (PyBytes_GET_SIZE(other) == PyBytes_GET_SIZE(bytes)
                                   && memcmp(PyBytes_AS_STRING(other), PyBytes_AS_STRING(bytes),
                                             (size_t)PyBytes_GET_SIZE(bytes)) == 0)) {
                break;
            }
        }
        if (slots[slot] == 0) {
            distinct[table_size++] = bytes;
            slots[slot] = (uint32_t)table_size;
            table_bound += 1 + 5 * PyBytes_GET_SIZE(bytes) + 2;
        }
        indices[e] = slots[slot] - 1;
    }
    /* orjson.dumps([_plain(data) for data in the table]) */
    parts[3] = PyBytes_FromStringAndSize(NULL, table_bound);
    if (parts[3] == NULL) {
        goto done;
    }
    char *out = PyBytes_AS_STRING(parts[3]);
    *out++ = '[';
    for (Py_ssize_t t = 0; t < table_size; t++) {
        const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(distinct[t]);
        Py_ssize_t n = PyBytes_GET_SIZE(distinct[t]);
        if (t > 0) {
            *out++ = ',';
        }
        if (utf8_valid(s, n)) { /* the table keeps valid UTF-8 as text */
            out = fp_write_token_string(out, s, n);
            continue;
        }
        *out++ = '[';
        out = fp_write_byte_values(out, s, n);
        *out++ = ']';
    }
    *out++ = ']';
    if (_PyBytes_Resize(&parts[3], out - PyBytes_AS_STRING(parts[3])) < 0) {
        goto done;
    }
    int kind = 4;
    if ((parts[4] = fp_float_column(entries.values, total, &kind)) == NULL) {
        goto done;
    }
    result = Py_BuildValue("(OOOOOi)", parts[3], parts[0], parts[1], parts[2], parts[4], kind);
done:
    for (int i = 0; i < 5; i++) {
        Py_XDECREF(parts[i]);
    }
    PyMem_Free(slots);
    PyMem_Free(distinct);
    entries_free(&entries);
    return result;
}

/* --- a stream's tokens ------------------------------------------------------------------------------ */

/* The id in slot `id_slot` of a Token or Candidate when it names bytes in the table equal to the record's
 * own (slot 0), else -1: then its bytes are not the table's and the batch cannot stand for it. */
static Py_ssize_t
table_id(const TokenBatch *batch, PyObject *record, Py_ssize_t id_slot)
{
    PyObject *data = PyTuple_GET_ITEM(record, 0), *id_object = PyTuple_GET_ITEM(record, id_slot);
    if (!PyLong_CheckExact(id_object) || !PyBytes_CheckExact(data)) {
        return -1;
    }
    int overflow = 0;
    long long id = PyLong_AsLongLongAndOverflow(id_object, &overflow);
    if (overflow || id < 0 || id >= PyTuple_GET_SIZE(batch->table) || id > INT32_MAX) {
        return -1;
    }
    PyObject *known = PyTuple_GET_ITEM(batch->table, (Py_ssize_t)id);
    if (known != data && (!PyBytes_CheckExact(known) || PyBytes_GET_SIZE(known) != PyBytes_GET_SIZE(data)
                          || memcmp(PyBytes_AS_STRING(known), PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)) != 0)) {
        return -1;
    }
    return (Py_ssize_t)id;
}

/* A Token this batch can hold as it renders: not special, bytes and alternatives that are the table's ids,
 * plain logprobs, at most MAX_CANDIDATES alternatives. */
static int
fits(const TokenBatch *batch, PyObject *token)
{
    if (!PyTuple_Check(token) || PyTuple_GET_SIZE(token) != 7 || PyTuple_GET_ITEM(token, 4) != Py_False) {
        return 0;
    }
    PyObject *top = PyTuple_GET_ITEM(token, 2), *absent = PyTuple_GET_ITEM(token, 6);
    if ((absent != Py_True && absent != Py_False) || !PyTuple_CheckExact(top) || PyTuple_GET_SIZE(top) > MAX_CANDIDATES
        || !plain_logprob(PyTuple_GET_ITEM(token, 1)) || table_id(batch, token, 3) < 0) {
        return 0;
    }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(top); j++) {
        PyObject *candidate = PyTuple_GET_ITEM(top, j);
        if (!PyTuple_Check(candidate) || PyTuple_GET_SIZE(candidate) != 4
            || !plain_logprob(PyTuple_GET_ITEM(candidate, 1)) || table_id(batch, candidate, 2) < 0) {
            return 0;
        }
    }
    return 1;
}

/* append(tokens: list[Token]) -> bool: every token appended (True), or none (False) when one does not fit
 * (see `fits`): the caller then keeps them another way. What the batch renders for them is what
 * render_responses_json renders for the Tokens; tokens() gives them back as the id readers make them. */
static PyObject *
batch_append(TokenBatch *batch, PyObject *tokens)
{
    if (!PyList_CheckExact(tokens)) {
        PyErr_SetString(PyExc_TypeError, "append(tokens: list)");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(tokens);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!fits(batch, PyList_GET_ITEM(tokens, i))) {
            Py_RETURN_FALSE;
        }
    }
    Py_ssize_t tokens_before = batch->count, alternatives_before = batch->alternative_count;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *token = PyList_GET_ITEM(tokens, i), *top = PyTuple_GET_ITEM(token, 2);
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(top); j++) {
            PyObject *candidate = PyTuple_GET_ITEM(top, j);
            if (fp_batch_alternative((PyObject *)batch, table_id(batch, candidate, 2),
                                     PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(candidate, 1))) < 0) {
                goto failed;
            }
        }
        if (fp_batch_token((PyObject *)batch, table_id(batch, token, 3), PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(token, 1)),
                           0, PyTuple_GET_ITEM(token, 6) == Py_True, -1) < 0) {
            goto failed;
        }
    }
    Py_RETURN_TRUE;
failed: /* out of memory partway: the batch is left as it was */
    batch->count = tokens_before;
    batch->alternative_count = alternatives_before;
    return NULL;
}

/* extend(other: TokenBatch) -> bool: every token of `other` appended (True), or none (False) when it has a
 * special token or another table (the caller then appends its tokens() another way). A stream chunk read
 * as a batch joins its message's this way: ids and logprobs copied, no Token built. */
static PyObject *
batch_extend(TokenBatch *batch, PyObject *object)
{
    if (Py_TYPE(object) != &TokenBatchType) {
        PyErr_SetString(PyExc_TypeError, "extend(other: TokenBatch)");
        return NULL;
    }
    TokenBatch *other = (TokenBatch *)object;
    if (other->table != batch->table) {
        Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < other->count; i++) {
        if (other->flags[i] & TOKEN_SPECIAL) {
            Py_RETURN_FALSE; /* append() refuses them too: the message keeps only text's tokens */
        }
    }
    /* Copied whole: its rows after ours, its alternatives after ours (their ends moved by as many). */
    if (other->count == 0) {
        Py_RETURN_TRUE;
    }
    if (reserve(batch, other->count, other->alternative_count) < 0) {
        return NULL;
    }
    Py_ssize_t tokens = batch->count, alternatives = batch->alternative_count;
    memcpy(batch->ids + tokens, other->ids, sizeof(int32_t) * (size_t)other->count);
    memcpy(batch->logprobs + tokens, other->logprobs, sizeof(double) * (size_t)other->count);
    memcpy(batch->flags + tokens, other->flags, (size_t)other->count); /* TOKEN_TOP_ABSENT kept; none special */
    for (Py_ssize_t i = 0; i < other->count; i++) {
        batch->alternatives_end[tokens + i] = alternatives + other->alternatives_end[i];
    }
    if (other->alternative_count) {
        memcpy(batch->alternative_ids + alternatives, other->alternative_ids,
               sizeof(int32_t) * (size_t)other->alternative_count);
        memcpy(batch->alternative_logprobs + alternatives, other->alternative_logprobs,
               sizeof(double) * (size_t)other->alternative_count);
    }
    batch->count += other->count;
    batch->alternative_count += other->alternative_count;
    Py_RETURN_TRUE;
}

/* sole_visible_bytes() -> bytes | None: the bytes of the one token the batch holds when it holds exactly
 * one and that one is not special (the usual stream chunk, which the grouper passes on whole); else None. */
static PyObject *
batch_sole_visible_bytes(TokenBatch *batch, PyObject *unused)
{
    if (batch->count != 1 || batch->flags[0] & TOKEN_SPECIAL) {
        Py_RETURN_NONE;
    }
    return Py_NewRef(bytes_of(batch, batch->ids[0]));
}

PyObject *
fp_token_batch(PyObject *module, PyObject *table)
{
    if (!PyTuple_CheckExact(table)) {
        PyErr_SetString(PyExc_TypeError, "token_batch(table: tuple)");
        return NULL;
    }
    return fp_batch_new(table);
}

static PyObject *
batch_nbytes(TokenBatch *batch, void *closure)
{
    size_t per_token = sizeof(int32_t) + sizeof(double) + 1 + sizeof(Py_ssize_t);
    size_t per_alternative = sizeof(int32_t) + sizeof(double);
    return PyLong_FromSize_t((size_t)batch->capacity * per_token + (size_t)batch->alternative_capacity * per_alternative);
}

static PyObject *
batch_visible(TokenBatch *batch, void *closure)
{
    Py_ssize_t visible = 0;
    for (Py_ssize_t i = 0; i < batch->count; i++) {
        visible += !(batch->flags[i] & TOKEN_SPECIAL);
    }
    return PyLong_FromSsize_t(visible);
}

static PyGetSetDef batch_getset[] = {
    {"visible", (getter)batch_visible, NULL, "How many tokens are not special (spell text).", NULL},
    {"nbytes", (getter)batch_nbytes, NULL, "Bytes held by the arrays (their capacity).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef batch_methods[] = {
    {"tokens", (PyCFunction)(void (*)(void))batch_tokens, METH_FASTCALL,
     "tokens(visible_only=False) -> list[Token]: what the id readers make of the same logprobs."},
    {"spells", (PyCFunction)batch_spells, METH_O,
     "spells(text) -> bool: the visible tokens' bytes are exactly text's UTF-8."},
    {"render_json", (PyCFunction)(void (*)(void))batch_render_json, METH_FASTCALL,
     "render_json(k, dumps) -> bytes: render_responses_json(tokens(True), k)."},
    {"store_columns", (PyCFunction)batch_store_columns, METH_O,
     "store_columns(k) -> (table, list lengths, counts, indices, floats, kind) | None: render_json(k)'s list as "
     "the store's columns (see store.codec)."},
    {"append", (PyCFunction)batch_append, METH_O,
     "append(tokens) -> bool: all appended, or none when one is not the plain id shape."},
    {"extend", (PyCFunction)batch_extend, METH_O,
     "extend(other) -> bool: all of another batch's tokens appended, or none (a special token, another table)."},
    {"sole_visible_bytes", (PyCFunction)batch_sole_visible_bytes, METH_NOARGS,
     "sole_visible_bytes() -> bytes | None: its one token's bytes when it holds exactly one, not special."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods batch_as_sequence = {
    .sq_length = (lenfunc)batch_length,
    .sq_item = (ssizeargfunc)batch_item,
};

static PyTypeObject TokenBatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway.logprobs._fastpath.TokenBatch",
    .tp_doc = "A body's tokens in flat arrays (ids, logprobs, alternatives); see _fastpath_body.c.",
    .tp_basicsize = sizeof(TokenBatch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_as_sequence = &batch_as_sequence,
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
};

int
fp_body_init(PyObject *module)
{
    if (PyType_Ready(&TokenBatchType) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "TokenBatch", (PyObject *)&TokenBatchType);
}
