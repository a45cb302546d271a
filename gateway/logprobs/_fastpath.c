/* Compiled twins of the logprob hot path (parse.py's id readers, render.py's entry renderer).
 *
 * Each function either returns exactly what its pure-Python twin returns, or None ("not my
 * shape"), and the caller then runs the Python code. Nothing here decides anything the Python
 * code does not: sentinels, duplicates, odd types and errors are all left to it. Property tests
 * (tests/test_fastpath.py) hold the twins equal.
 */
#include "_fastpath.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

static PyObject *key_token, *key_logprob, *key_bytes, *key_top_logprobs, *key_id, *key_special;

/* Set once by configure(): the Token and Candidate classes and the Origin members. */
static PyTypeObject *token_type, *candidate_type;
static PyObject *origin_token_id;

/* The id of a `token_id:N` string whose id has bytes in `table`, or -1. */
static Py_ssize_t
placeholder_id(PyObject *string, PyObject *table)
{
    if (string == NULL || !PyUnicode_CheckExact(string) || !PyUnicode_IS_COMPACT_ASCII(string)) {
        return -1; /* non-ASCII digits are Python's (str.isdecimal accepts them) */
    }
    return fp_placeholder_text((const char *)PyUnicode_DATA(string), PyUnicode_GET_LENGTH(string), table);
}

/* The id in `token_id:N` ASCII text whose id has bytes in `table`, or -1 (shared with the JSON reader). */
Py_ssize_t
fp_placeholder_text(const char *text, Py_ssize_t length, PyObject *table)
{
    if (length < 10 || memcmp(text, "token_id:", 9) != 0) {
        return -1;
    }
    Py_ssize_t size = PyTuple_GET_SIZE(table);
    Py_ssize_t id = 0;
    for (Py_ssize_t i = 9; i < length; i++) {
        char c = text[i];
        if (c < '0' || c > '9') {
            return -1;
        }
        id = id * 10 + (c - '0');
        if (id >= size) {
            return -1; /* only grows from here (leading zeros keep it small) */
        }
    }
    return PyTuple_GET_ITEM(table, id) == Py_None ? -1 : id;
}

/* An instance of a tuple subclass (a NamedTuple) with `count` slots, the token id in slot `id_slot`
 * and the others still to fill. */
static PyObject *
new_record(PyTypeObject *type, Py_ssize_t count, Py_ssize_t id_slot, Py_ssize_t id)
{
    PyObject *id_object = PyLong_FromSsize_t(id);
    if (id_object == NULL) {
        return NULL;
    }
    PyObject *record = type->tp_alloc(type, count);
    if (record == NULL) {
        Py_DECREF(id_object);
        return NULL;
    }
    PyTuple_SET_ITEM(record, id_slot, id_object);
    return record;
}

PyObject *
fp_candidate(PyObject *data, PyObject *logprob, Py_ssize_t id)
{
    PyObject *record = new_record(candidate_type, 4, 2, id);
    if (record == NULL) {
        return NULL;
    }
    PyTuple_SET_ITEM(record, 0, Py_NewRef(data));
    PyTuple_SET_ITEM(record, 1, Py_NewRef(logprob));
    PyTuple_SET_ITEM(record, 3, Py_NewRef(origin_token_id));
    return fp_untracked(record);
}

PyObject *
fp_token(PyObject *data, PyObject *logprob, PyObject *top, Py_ssize_t id, int special, int top_absent)
{
    PyObject *record = new_record(token_type, 7, 3, id);
    if (record == NULL) {
        return NULL;
    }
    PyTuple_SET_ITEM(record, 0, Py_NewRef(data));
    PyTuple_SET_ITEM(record, 1, Py_NewRef(logprob));
    PyTuple_SET_ITEM(record, 2, Py_NewRef(top));
    PyTuple_SET_ITEM(record, 4, Py_NewRef(special ? Py_True : Py_False));
    PyTuple_SET_ITEM(record, 5, Py_NewRef(origin_token_id));
    PyTuple_SET_ITEM(record, 6, Py_NewRef(top_absent ? Py_True : Py_False));
    return fp_untracked(record);
}

/* Look a key up in a dict; *found is NULL when absent. Returns -1 on an error (already set). */
static inline int
lookup(PyObject *dict, PyObject *key, PyObject **found)
{
    *found = PyDict_GetItemWithError(dict, key);
    return (*found == NULL && PyErr_Occurred()) ? -1 : 0;
}

/* Ready to build records from `table` and `flags`: configured, and the two agree; -1 with an error set if not. */
int
fp_check_ready(PyObject *table, PyObject *flags)
{
    if (token_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_fastpath.configure() has not been called");
        return -1;
    }
    if (!PyTuple_CheckExact(table) || !PyBytes_CheckExact(flags) || PyBytes_GET_SIZE(flags) != PyTuple_GET_SIZE(table)) {
        PyErr_SetString(PyExc_TypeError, "table must be a tuple and flags bytes of the same length");
        return -1;
    }
    return 0;
}

/* Chat `logprobs.content` whose tokens and alternatives are all `token_id:N`: see parse._chat_from_ids. */
static PyObject *
chat_from_ids(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "chat_from_ids(content, table, special_flags)");
        return NULL;
    }
    PyObject *content = args[0], *table = args[1], *flags = args[2];
    if (fp_check_ready(table, flags) < 0) {
        return NULL;
    }
    if (!PyList_CheckExact(content)) {
        Py_RETURN_NONE;
    }
    const char *special_flags = PyBytes_AS_STRING(flags);
    Py_ssize_t count = PyList_GET_SIZE(content);
    PyObject *tokens = PyList_New(count);
    if (tokens == NULL) {
        return NULL;
    }
    PyObject *alternatives[MAX_CANDIDATES];
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(content, i);
        PyObject *found, *string, *logprob, *listed, *special_value;
        if (!PyDict_CheckExact(item)) {
            goto not_mine;
        }
        if (lookup(item, key_id, &found) < 0) {
            goto error;
        }
        if (found != NULL) {
            goto not_mine;
        }
        if (lookup(item, key_token, &string) < 0 || lookup(item, key_logprob, &logprob) < 0
            || lookup(item, key_top_logprobs, &listed) < 0 || lookup(item, key_special, &special_value) < 0) {
            goto error;
        }
        Py_ssize_t id = placeholder_id(string, table);
        if (id < 0 || !plain_logprob(logprob)) {
            goto not_mine;
        }
        Py_ssize_t alternative_count = 0;
        if (listed != NULL && listed != Py_None) {
            if (!PyList_CheckExact(listed) || PyList_GET_SIZE(listed) > MAX_CANDIDATES) {
                goto not_mine; /* a truthy non-list is refused by Python; a falsy one it reads as none */
            }
            alternative_count = PyList_GET_SIZE(listed);
        }
        Py_ssize_t made = 0;
        for (; made < alternative_count; made++) {
            PyObject *alt = PyList_GET_ITEM(listed, made);
            PyObject *alt_string, *alt_logprob;
            if (!PyDict_CheckExact(alt)) {
                break;
            }
            if (lookup(alt, key_id, &found) < 0 || lookup(alt, key_token, &alt_string) < 0
                || lookup(alt, key_logprob, &alt_logprob) < 0) {
                goto error_alternatives;
            }
            Py_ssize_t alt_id = found == NULL ? placeholder_id(alt_string, table) : -1;
            if (alt_id < 0 || !plain_logprob(alt_logprob)) {
                break;
            }
            alternatives[made] = fp_candidate(PyTuple_GET_ITEM(table, alt_id), alt_logprob, alt_id);
            if (alternatives[made] == NULL) {
                goto error_alternatives;
            }
        }
        if (made < alternative_count) {
            for (Py_ssize_t j = 0; j < made; j++) {
                Py_DECREF(alternatives[j]);
            }
            goto not_mine;
        }
        PyObject *top = fp_untracked(PyTuple_New(alternative_count));
        if (top == NULL) {
            goto error_alternatives;
        }
        for (Py_ssize_t j = 0; j < alternative_count; j++) {
            PyTuple_SET_ITEM(top, j, alternatives[j]); /* steals */
        }
        int special = special_flags[id] != 0 || special_value == Py_True;
        PyObject *record = fp_token(PyTuple_GET_ITEM(table, id), logprob, top, id, special, 0);
        Py_DECREF(top);
        if (record == NULL) {
            goto error;
        }
        PyList_SET_ITEM(tokens, i, record);
        continue;
    error_alternatives:
        for (Py_ssize_t j = 0; j < made; j++) {
            Py_DECREF(alternatives[j]);
        }
        goto error;
    }
    return tokens;
not_mine:
    Py_DECREF(tokens); /* PyList_New's unfilled slots are NULL: the list frees only what was set */
    Py_RETURN_NONE;
error:
    Py_DECREF(tokens);
    return NULL;
}

/* Legacy completions arrays whose tokens and keys are all `token_id:N`: see parse._completions_from_ids. */
static PyObject *
completions_from_ids(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "completions_from_ids(strings, values, tops, table, special_flags)");
        return NULL;
    }
    PyObject *strings = args[0], *values = args[1], *tops = args[2], *table = args[3], *flags = args[4];
    if (fp_check_ready(table, flags) < 0) {
        return NULL;
    }
    if (!PyList_CheckExact(strings) || !PyList_CheckExact(values) || (tops != Py_None && !PyList_CheckExact(tops))) {
        Py_RETURN_NONE;
    }
    Py_ssize_t count = PyList_GET_SIZE(strings);
    if (PyList_GET_SIZE(values) != count || (tops != Py_None && PyList_GET_SIZE(tops) != count)) {
        Py_RETURN_NONE;
    }
    const char *special_flags = PyBytes_AS_STRING(flags);
    PyObject *tokens = PyList_New(count);
    if (tokens == NULL) {
        return NULL;
    }
    PyObject *alternatives[MAX_CANDIDATES];
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t id = placeholder_id(PyList_GET_ITEM(strings, i), table);
        PyObject *logprob = PyList_GET_ITEM(values, i);
        if (id < 0 || (logprob != Py_None && !plain_logprob(logprob))) {
            goto not_mine;
        }
        PyObject *top_dict = tops == Py_None ? Py_None : PyList_GET_ITEM(tops, i);
        Py_ssize_t alternative_count = 0;
        if (top_dict != Py_None) {
            if (!PyDict_CheckExact(top_dict) || PyDict_GET_SIZE(top_dict) > MAX_CANDIDATES) {
                goto not_mine;
            }
            alternative_count = PyDict_GET_SIZE(top_dict);
        }
        Py_ssize_t made = 0, position = 0;
        PyObject *key, *alt_logprob;
        while (made < alternative_count && PyDict_Next(top_dict, &position, &key, &alt_logprob)) {
            Py_ssize_t alt_id = placeholder_id(key, table);
            if (alt_id < 0 || !plain_logprob(alt_logprob)) {
                break;
            }
            alternatives[made] = fp_candidate(PyTuple_GET_ITEM(table, alt_id), alt_logprob, alt_id);
            if (alternatives[made] == NULL) {
                for (Py_ssize_t j = 0; j < made; j++) {
                    Py_DECREF(alternatives[j]);
                }
                goto error;
            }
            made++;
        }
        if (made < alternative_count) {
            for (Py_ssize_t j = 0; j < made; j++) {
                Py_DECREF(alternatives[j]);
            }
            goto not_mine;
        }
        PyObject *top = fp_untracked(PyTuple_New(alternative_count));
        if (top == NULL) {
            for (Py_ssize_t j = 0; j < made; j++) {
                Py_DECREF(alternatives[j]);
            }
            goto error;
        }
        for (Py_ssize_t j = 0; j < alternative_count; j++) {
            PyTuple_SET_ITEM(top, j, alternatives[j]);
        }
        PyObject *record = fp_token(PyTuple_GET_ITEM(table, id), logprob, top, id, special_flags[id] != 0,
                                 top_dict == Py_None);
        Py_DECREF(top);
        if (record == NULL) {
            goto error;
        }
        PyList_SET_ITEM(tokens, i, record);
    }
    return tokens;
not_mine:
    Py_DECREF(tokens);
    Py_RETURN_NONE;
error:
    Py_DECREF(tokens);
    return NULL;
}

/* {"token", "logprob", "bytes"} (+ "top_logprobs" when `top` is given); steals nothing. */
static PyObject *
entry(PyObject *data, PyObject *logprob, PyObject *top)
{
    const char *raw = PyBytes_AS_STRING(data);
    Py_ssize_t length = PyBytes_GET_SIZE(data);
    PyObject *string = PyUnicode_DecodeUTF8(raw, length, "backslashreplace");
    if (string == NULL) {
        return NULL;
    }
    PyObject *numbers = fp_untracked(PyList_New(length));
    if (numbers == NULL) {
        Py_DECREF(string);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < length; i++) {
        PyList_SET_ITEM(numbers, i, PyLong_FromLong((unsigned char)raw[i])); /* small ints: cached, no failure */
    }
    PyObject *dict = PyDict_New();
    if (dict == NULL || PyDict_SetItem(dict, key_token, string) < 0 || PyDict_SetItem(dict, key_logprob, logprob) < 0
        || PyDict_SetItem(dict, key_bytes, numbers) < 0
        || (top != NULL && PyDict_SetItem(dict, key_top_logprobs, top) < 0)) {
        Py_XDECREF(dict);
        dict = NULL;
    }
    Py_DECREF(string);
    Py_DECREF(numbers);
    return fp_untracked(dict);
}

/* 1 when the candidates are distinct (by id when all have one, by bytes when none has), 0 when not
 * or when mixed (Python's de-duplication then decides), -1 on an error. */
static int
distinct(PyObject *const *candidates, Py_ssize_t count)
{
    PyObject *first_id = PyTuple_GET_ITEM(candidates[0], 2);
    if (first_id == Py_None) {
        for (Py_ssize_t i = 0; i < count; i++) {
            if (PyTuple_GET_ITEM(candidates[i], 2) != Py_None) {
                return 0;
            }
            PyObject *a = PyTuple_GET_ITEM(candidates[i], 0);
            for (Py_ssize_t j = 0; j < i; j++) {
                PyObject *b = PyTuple_GET_ITEM(candidates[j], 0);
                if (PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b)
                    && memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), PyBytes_GET_SIZE(a)) == 0) {
                    return 0;
                }
            }
        }
        return 1;
    }
    long long ids[MAX_CANDIDATES];
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *id = PyTuple_GET_ITEM(candidates[i], 2);
        if (!PyLong_CheckExact(id)) {
            return 0;
        }
        int overflow = 0;
        ids[i] = PyLong_AsLongLongAndOverflow(id, &overflow);
        if (overflow) {
            return 0;
        }
        for (Py_ssize_t j = 0; j < i; j++) {
            if (ids[j] == ids[i]) {
                return 0;
            }
        }
    }
    return 1;
}

/* The plain shape of one token (bytes, a plain logprob, a tuple of distinct candidates with plain
 * logprobs): its alternatives sorted (descending, stable) into `order`, and how many of them to keep;
 * -1 when the token is not that shape (Python decides it then). */
static Py_ssize_t
plain_alternatives(PyObject *record, Py_ssize_t k, PyObject **order)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 3) {
        return -1;
    }
    PyObject *data = PyTuple_GET_ITEM(record, 0), *top = PyTuple_GET_ITEM(record, 2);
    if (!PyBytes_CheckExact(data) || !plain_logprob(PyTuple_GET_ITEM(record, 1)) || !PyTuple_CheckExact(top)) {
        return -1;
    }
    Py_ssize_t count = k > 0 ? PyTuple_GET_SIZE(top) : 0;
    if (count > MAX_CANDIDATES) {
        return -1;
    }
    double values[MAX_CANDIDATES];
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *cand = PyTuple_GET_ITEM(top, i);
        if (!PyTuple_Check(cand) || PyTuple_GET_SIZE(cand) < 3 || !PyBytes_CheckExact(PyTuple_GET_ITEM(cand, 0))
            || !plain_logprob(PyTuple_GET_ITEM(cand, 1))) {
            return -1;
        }
        /* Insertion sort, descending, stable: an element moves only past strictly smaller ones. */
        double value = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(cand, 1));
        Py_ssize_t j = i;
        while (j > 0 && values[j - 1] < value) {
            values[j] = values[j - 1];
            order[j] = order[j - 1];
            j--;
        }
        values[j] = value;
        order[j] = cand;
    }
    if (count > 1 && distinct(order, count) != 1) {
        return -1;
    }
    return k <= 0 ? 0 : (count < k ? count : k);
}

/* One Responses/chat entry, or NULL with no error set when the token is not the plain shape. */
static PyObject *
render_plain(PyObject *record, Py_ssize_t k, int *not_mine)
{
    PyObject *order[MAX_CANDIDATES];
    Py_ssize_t kept = plain_alternatives(record, k, order);
    *not_mine = kept < 0;
    if (kept < 0) {
        return NULL;
    }
    PyObject *alternatives = fp_untracked(PyList_New(kept));
    if (alternatives == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < kept; i++) {
        PyObject *alt = entry(PyTuple_GET_ITEM(order[i], 0), PyTuple_GET_ITEM(order[i], 1), NULL);
        if (alt == NULL) {
            Py_DECREF(alternatives);
            return NULL;
        }
        PyList_SET_ITEM(alternatives, i, alt);
    }
    PyObject *result = entry(PyTuple_GET_ITEM(record, 0), PyTuple_GET_ITEM(record, 1), alternatives);
    Py_DECREF(alternatives);
    return result;
}

/* render.render_responses: one entry per token; tokens not of the plain shape go to `fallback(token, k)`. */
static PyObject *
render_entries(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "render_entries(tokens: list, k: int, fallback)");
        return NULL;
    }
    PyObject *tokens = args[0], *fallback = args[2];
    Py_ssize_t k = PyLong_AsSsize_t(args[1]);
    if (k == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(tokens);
    PyObject *entries = PyList_New(count);
    if (entries == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *record = PyList_GET_ITEM(tokens, i);
        int not_mine;
        PyObject *rendered = render_plain(record, k, &not_mine);
        if (rendered == NULL && not_mine && !PyErr_Occurred()) {
            PyObject *call_args[2] = {record, args[1]};
            rendered = PyObject_Vectorcall(fallback, call_args, 2, NULL);
        }
        if (rendered == NULL) {
            Py_DECREF(entries);
            return NULL;
        }
        PyList_SET_ITEM(entries, i, rendered);
    }
    return entries;
}

/* --- rendering straight to JSON ------------------------------------------------------------------
 * The same entries as render_entries, as the JSON orjson would write for them (byte for byte): no dict,
 * list or str per entry, which is where the time went (each allocation costs hundreds of ns here).
 * Floats are formatted by orjson itself, in one call for the whole batch: shortest round-trip text,
 * the same as every other number the gateway writes, and ~25x faster than repr(). */


static const char hex_digits[] = "0123456789abcdef";

/* The JSON string of bytes.decode("utf-8", "backslashreplace"), escaped as orjson escapes (also the
 * store scanner's check of a stored token, _fastpath_store.c). */
char *
fp_write_token_string(char *out, const unsigned char *s, Py_ssize_t n)
{
    *out++ = '"';
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c >= 0x80) {
            Py_ssize_t length = utf8_sequence(s + i, n - i);
            if (length > 0) {
                memcpy(out, s + i, length);
                out += length;
                i += length;
            }
            else { /* backslashreplace made it the four characters \xNN; JSON escapes the backslash */
                memcpy(out, "\\\\x", 3);
                out[3] = hex_digits[c >> 4];
                out[4] = hex_digits[c & 15];
                out += 5;
                i++;
            }
            continue;
        }
        i++;
        if (c == '"' || c == '\\') {
            *out++ = '\\';
            *out++ = (char)c;
        }
        else if (c >= 0x20) {
            *out++ = (char)c;
        }
        else {
            *out++ = '\\';
            switch (c) {
            case '\b': *out++ = 'b'; break;
            case '\t': *out++ = 't'; break;
            case '\n': *out++ = 'n'; break;
            case '\f': *out++ = 'f'; break;
            case '\r': *out++ = 'r'; break;
            default:
                memcpy(out, "u00", 3);
                out[3] = hex_digits[c >> 4];
                out[4] = hex_digits[c & 15];
                out += 5;
            }
        }
    }
    *out++ = '"';
    return out;
}

char *
fp_write_entry_head(char *out, PyObject *data, const char *number, Py_ssize_t number_length)
{
    const unsigned char *raw = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t length = PyBytes_GET_SIZE(data);
    memcpy(out, "{\"token\":", 9);
    out = fp_write_token_string(out + 9, raw, length);
    memcpy(out, ",\"logprob\":", 11);
    memcpy(out + 11, number, number_length);
    out += 11 + number_length;
    memcpy(out, ",\"bytes\":[", 10);
    out = fp_write_byte_values(out + 10, raw, length);
    *out++ = ']';
    return out;
}

/* Each byte value's text and a comma ("7,", "65,", "255,"), padded to 4 bytes, and its length with the comma:
 * a value is one 4-byte copy (made by init_byte_texts when the module loads). */
static char byte_texts[256][4];
static unsigned char byte_text_lengths[256];

static void
init_byte_texts(void)
{
    for (int byte = 0; byte < 256; byte++) {
        char *text = byte_texts[byte];
        int length = 0;
        if (byte >= 100) {
            text[length++] = (char)('0' + byte / 100);
        }
        if (byte >= 10) {
            text[length++] = (char)('0' + byte / 10 % 10);
        }
        text[length++] = (char)('0' + byte % 10);
        text[length++] = ',';
        byte_text_lengths[byte] = (unsigned char)length;
    }
}

char *
fp_write_byte_values(char *out, const unsigned char *s, Py_ssize_t n)
{
    if (n == 0) {
        return out;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* the last value's 4 bytes end within 4n: (n - 1) * 4 + 4 */
        memcpy(out, byte_texts[s[i]], 4);
        out += byte_text_lengths[s[i]];
    }
    return out - 1; /* not the last comma */
}

/* `numbers`, what dumps wrote for a list of `total` floats ("[a,b,c]") -> where each number starts, and
 * starts[total] one past the last one's closing bracket (a float's text holds no comma); -1 with an error
 * set when it is not that. */
int
fp_number_starts(PyObject *numbers, Py_ssize_t total, Py_ssize_t *starts)
{
    if (!PyBytes_CheckExact(numbers) || PyBytes_GET_SIZE(numbers) < 2) {
        PyErr_SetString(PyExc_TypeError, "dumps must return the JSON bytes of a list");
        return -1;
    }
    const char *text = PyBytes_AS_STRING(numbers);
    Py_ssize_t text_length = PyBytes_GET_SIZE(numbers);
    Py_ssize_t found = 0;
    starts[found++] = 1;
    /* memchr from comma to comma: the list is ~20 bytes a number, hundreds of numbers a body */
    const char *p = text + 1, *last = text + text_length - 1;
    while (p < last && found <= total) {
        const char *comma = memchr(p, ',', (size_t)(last - p));
        if (comma == NULL) {
            break;
        }
        starts[found++] = comma + 1 - text;
        p = comma + 1;
    }
    if ((total > 0 && found != total) || (total == 0 && text_length != 2)) {
        PyErr_SetString(PyExc_ValueError, "dumps wrote an unexpected list of numbers");
        return -1;
    }
    starts[total] = text_length;
    return 0;
}

/* Pass 2 of the JSON renderers: the array of entries written into *result (sized for it), which is then cut
 * to its length (NULL if that fails). kept[t]: token t's alternatives (-1: token t is not written); data: the
 * bytes of each written entry in order, numbers + starts[i]: its logprob's text (fp_number_starts). */
void
fp_write_entries(PyObject **result, Py_ssize_t count, const Py_ssize_t *kept, PyObject *const *data,
                 const char *numbers, const Py_ssize_t *starts)
{
    char *out = PyBytes_AS_STRING(*result);
    *out++ = '[';
    Py_ssize_t position = 0, written = 0;
    for (Py_ssize_t t = 0; t < count; t++) {
        if (kept[t] < 0) {
            continue;
        }
        if (written++ > 0) {
            *out++ = ',';
        }
        for (Py_ssize_t i = -1; i < kept[t]; i++, position++) {
            Py_ssize_t number_length = starts[position + 1] - starts[position] - 1;
            if (i > 0) {
                *out++ = ',';
            }
            out = fp_write_entry_head(out, data[position], numbers + starts[position], number_length);
            if (i < 0) {
                memcpy(out, ",\"top_logprobs\":[", 17);
                out += 17;
            }
            else {
                *out++ = '}';
            }
        }
        memcpy(out, "]}", 2);
        out += 2;
    }
    *out++ = ']';
    _PyBytes_Resize(result, out - PyBytes_AS_STRING(*result));
}

/* The JSON array of entries: `floats` (each written entry's logprob, in order; `total` of them) formatted
 * by `dumps` in one call, then written with `data` (each entry's bytes) as fp_write_entries does, into bytes
 * of at most `bound` + the numbers' length. A new reference, or NULL with an error set. */
PyObject *
fp_entries_json(Py_ssize_t count, const Py_ssize_t *kept, PyObject *const *data, Py_ssize_t total, PyObject *floats,
                PyObject *dumps, Py_ssize_t bound)
{
    PyObject *result = NULL, *numbers = PyObject_CallOneArg(dumps, floats);
    Py_ssize_t *starts = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(total + 1));
    if (numbers == NULL || starts == NULL) {
        if (starts == NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    if (fp_number_starts(numbers, total, starts) < 0) {
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, bound + PyBytes_GET_SIZE(numbers));
    if (result != NULL) {
        fp_write_entries(&result, count, kept, data, PyBytes_AS_STRING(numbers), starts);
    }
done:
    PyMem_Free(starts);
    Py_XDECREF(numbers);
    return result;
}

/* render.render_responses_json: bytes of the JSON array of entries, or None when any token is not the
 * plain shape (Python then renders the list and orjson serializes it). */
static PyObject *
render_entries_json(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "render_entries_json(tokens: list, k: int, dumps)");
        return NULL;
    }
    PyObject *tokens = args[0], *dumps = args[2];
    Py_ssize_t k = PyLong_AsSsize_t(args[1]);
    if (k == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(tokens);
    Py_ssize_t per_token = 1 + (k <= 0 ? 0 : (k < MAX_CANDIDATES ? k : MAX_CANDIDATES));
    /* Pass 1: check every token, fix each one's alternatives, collect the floats in writing order. */
    PyObject **records = PyMem_Malloc(sizeof(PyObject *) * (size_t)(count * per_token + 1));
    Py_ssize_t *kept = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(count + 1));
    PyObject *floats = PyList_New(0), *result = NULL;
    if (records == NULL || kept == NULL || floats == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0, bound = 2;
    for (Py_ssize_t t = 0; t < count; t++) {
        PyObject *record = PyList_GET_ITEM(tokens, t);
        PyObject *order[MAX_CANDIDATES];
        Py_ssize_t alternatives = plain_alternatives(record, k, order);
        if (alternatives < 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        kept[t] = alternatives;
        for (Py_ssize_t i = -1; i < alternatives; i++) {
            PyObject *item = i < 0 ? record : order[i];
            records[total++] = PyTuple_GET_ITEM(item, 0);
            bound += FP_ENTRY_OVERHEAD + 10 * PyBytes_GET_SIZE(PyTuple_GET_ITEM(item, 0));
            if (PyList_Append(floats, PyTuple_GET_ITEM(item, 1)) < 0) {
                goto done;
            }
        }
    }
    result = fp_entries_json(count, kept, records, total, floats, dumps, bound);
done:
    PyMem_Free(records);
    PyMem_Free(kept);
    Py_XDECREF(floats);
    return result;
}

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyType_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "configure(Token, Candidate, Origin.TOKEN_ID)");
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        PyTypeObject *type = (PyTypeObject *)args[i];
        /* A NamedTuple: a tuple subclass with no instance dict, so slots are all there is to fill. */
        if (!PyType_IsSubtype(type, &PyTuple_Type) || type->tp_basicsize != PyTuple_Type.tp_basicsize) {
            PyErr_SetString(PyExc_TypeError, "Token and Candidate must be NamedTuple classes");
            return NULL;
        }
    }
    Py_XSETREF(token_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(candidate_type, (PyTypeObject *)Py_NewRef(args[1]));
    Py_XSETREF(origin_token_id, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

/* --- decimal numbers (the body scanner's logprobs, the store scanner's column) ------------------------- */

/* Whether c (positive, normal) is the double nearest to D / 10^f, proven with exact integer arithmetic:
 * D / 10^f lies strictly between the midpoints to c's neighbours. 0 when it does not, or when the
 * numbers are too large to tell here (the caller then asks Python's reader). */
static int
nearest_double(uint64_t digits, int f, uint64_t power_of_five, double c)
{
#ifdef __SIZEOF_INT128__
    typedef unsigned __int128 u128;
    if (!(c >= DBL_MIN && c <= DBL_MAX)) {
        return 0;
    }
    uint64_t stored;
    memcpy(&stored, &c, sizeof stored); /* c is normal: m = the 52 stored bits and the implicit one */
    uint64_t m = (stored & ((1ULL << 52) - 1)) | (1ULL << 52); /* c = m * 2^q, m in [2^52, 2^53) */
    int q = (int)((stored >> 52) & 0x7FF) - 1075;
    int bits = 64 - __builtin_clzll(digits);
    /* X = D / (5^f 2^f) against (2m + 1) 2^(q - 1), then against the lower midpoint (2m - 1) 2^(q - 1), or
     * (4m - 1) 2^(q - 2) when c is a power of two (the neighbour below has half the spacing). */
    for (int side = 0; side < 2; side++) {
        uint64_t odd = side == 0 ? 2 * m + 1 : (m == (1ULL << 52) ? 4 * m - 1 : 2 * m - 1);
        int s = f + q - (side == 1 && m == (1ULL << 52) ? 2 : 1);
        u128 left = digits, right = (u128)odd * power_of_five;
        if (s < 0) {
            if (bits - s > 127) {
                return 0;
            }
            left <<= -s;
        }
        else {
            if (s > 10) { /* right is at least 2^52 * 2^s: past 2^64 > D, but say so only where it is plain */
                return 0;
            }
            right <<= s;
        }
        if (side == 0 ? !(left < right) : !(left > right)) {
            return 0;
        }
    }
    return 1;
#else
    (void)digits, (void)f, (void)power_of_five, (void)c;
    return 0;
#endif
}

/* The double nearest to digits / 10^decimals (negated for `negative`), as fp_read_decimal reads a number's
 * text once it has its significant digits (at most 19) and its decimals (after the exponent): 0 when it
 * cannot tell (Python's reader then decides). */
int
fp_decimal_value(uint64_t digits, int decimals, int negative, double *value)
{
    static const double powers_of_ten[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12,
                                           1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22, 1e23,
                                           1e24, 1e25, 1e26, 1e27};
    static const uint64_t powers_of_five[] = { /* 5^0 ... 5^27 (< 2^63) */
        1ULL, 5ULL, 25ULL, 125ULL, 625ULL, 3125ULL, 15625ULL, 78125ULL, 390625ULL, 1953125ULL, 9765625ULL,
        48828125ULL, 244140625ULL, 1220703125ULL, 6103515625ULL, 30517578125ULL, 152587890625ULL,
        762939453125ULL, 3814697265625ULL, 19073486328125ULL, 95367431640625ULL, 476837158203125ULL,
        2384185791015625ULL, 11920928955078125ULL, 59604644775390625ULL, 298023223876953125ULL,
        1490116119384765625ULL, 7450580596923828125ULL};
    if (digits == 0) {
        *value = negative ? -0.0 : 0.0;
        return 1;
    }
    if (decimals < 0 || decimals > 27) {
        return 0;
    }
    double quotient = (double)digits / powers_of_ten[decimals];
    if (!(digits < (1ULL << 53) && decimals <= 22)) {
        uint64_t power_of_five = powers_of_five[decimals];
        if (!nearest_double(digits, decimals, power_of_five, quotient)) {
            double below = nextafter(quotient, 0.0), above = nextafter(quotient, DBL_MAX);
            if (nearest_double(digits, decimals, power_of_five, below)) {
                quotient = below;
            }
            else if (nearest_double(digits, decimals, power_of_five, above)) {
                quotient = above;
            }
            else {
                return 0;
            }
        }
    }
    *value = negative ? -quotient : quotient;
    return 1;
}

/* float(text) for the text of a JSON number (checked to be one already), without Python's reader for the
 * usual spellings: up to 19 significant digits and up to 27 decimals (after the exponent), which covers the
 * full-precision text of float32 logprobs as vLLM and llama.cpp print them (17 digits, past the 15 of
 * Clinger's fast path; Python's reader takes ~2,000 instructions for each). The quotient is exact for
 * D < 2^53 and f <= 22 (both exact doubles, one correctly rounded division); otherwise it is within an
 * ulp or two and nearest_double proves it or a neighbour right. 0 when it cannot (Python's reader then
 * decides). */
int
fp_read_decimal(const unsigned char *p, const unsigned char *end, double *value)
{
    int negative = *p == '-';
    p += negative;
    uint64_t digits = 0;
    int significant = 0, decimals = 0;
    /* The integer part, then the fraction's digits (the text is a number: one `.` at most); leading
     * zeros are not significant, every digit after the point is a decimal. */
    if ((p = take_digits(p, end, &digits, &significant)) == NULL) {
        return 0;
    }
    if (p < end && *p == '.') {
        const unsigned char *fraction = ++p;
        if ((p = take_digits(p, end, &digits, &significant)) == NULL) {
            return 0;
        }
        decimals = (int)(p - fraction);
    }
    if (p < end) { /* e[-+]?\d+ */
        p++;
        int minus = p < end && *p == '-';
        p += p < end && (*p == '-' || *p == '+');
        int exponent = 0;
        for (; p < end; p++) {
            if (exponent > 1000) {
                return 0;
            }
            exponent = exponent * 10 + (*p - '0');
        }
        decimals += minus ? exponent : -exponent;
    }
    return fp_decimal_value(digits, decimals, negative, value);
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(Token, Candidate, Origin.TOKEN_ID): the classes records are made of."},
    {"chat_from_ids", (PyCFunction)(void (*)(void))chat_from_ids, METH_FASTCALL,
     "chat_from_ids(content, table, special_flags) -> list[Token] | None"},
    {"completions_from_ids", (PyCFunction)(void (*)(void))completions_from_ids, METH_FASTCALL,
     "completions_from_ids(strings, values, tops, table, special_flags) -> list[Token] | None"},
    {"render_entries", (PyCFunction)(void (*)(void))render_entries, METH_FASTCALL,
     "render_entries(tokens, k, fallback) -> list[dict]"},
    {"read_chunk", (PyCFunction)(void (*)(void))fp_read_chunk, METH_FASTCALL,
     "read_chunk(raw, completions, table, special_flags) -> (text, tokens, finish_reason) | None"},
    {"sse_events", (PyCFunction)fp_sse_events, METH_O,
     "sse_events(read) -> (payloads, done, cut) | None: the whole `data:` events of a read"},
    {"render_entries_json", (PyCFunction)(void (*)(void))render_entries_json, METH_FASTCALL,
     "render_entries_json(tokens, k, dumps) -> bytes | None"},
    {"store_columns", (PyCFunction)(void (*)(void))fp_store_columns, METH_FASTCALL,
     "store_columns(raw) -> (skeleton, table, list_lengths, counts, indices, floats, kind) | None"},
    {"split_body", (PyCFunction)(void (*)(void))fp_split_body, METH_FASTCALL,
     "split_body(raw, completions, table, special_flags) -> (body, TokenBatch) | None"},
    {"token_batch", (PyCFunction)fp_token_batch, METH_O,
     "token_batch(table) -> an empty TokenBatch that `append` grows (a stream's tokens)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "_fastpath", "Compiled twins of the logprob hot path.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    init_byte_texts();
    key_token = PyUnicode_InternFromString("token");
    key_logprob = PyUnicode_InternFromString("logprob");
    key_bytes = PyUnicode_InternFromString("bytes");
    key_top_logprobs = PyUnicode_InternFromString("top_logprobs");
    key_id = PyUnicode_InternFromString("id");
    key_special = PyUnicode_InternFromString("special");
    if (!key_token || !key_logprob || !key_bytes || !key_top_logprobs || !key_id || !key_special) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_definition);
    if (module != NULL && fp_body_init(module) < 0) {
        Py_CLEAR(module);
    }
    return module;
}
