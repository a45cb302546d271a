/* Reading chat bodies and stream chunks straight from their JSON bytes (see body_scan.py and
 * openai_compatible._read_chunk).
 *
 * A vLLM chat completion is mostly logprobs: 100 tokens with 5 alternatives are ~70 KB, and turning
 * all of it into dicts, lists and ints (which the `token_id:N` reader then throws away: the ids carry
 * the bytes) cost more than the rest of the request.
 *
 * fp_split_body(raw, completions, table, flags) (a whole chat or completions body): None, or (body, batch)
 * where `body` is `raw` with the value of `choices[0].logprobs` replaced by `null` (orjson reads it, small), and
 *   - `batch` (a TokenBatch, _fastpath_body.c) holds exactly the Tokens chat_from_ids (completions_from_ids)
 *     makes of that value read by orjson;
 *   - orjson accepts `body` if and only if it accepts `raw`.
 * fp_read_chunk(raw, completions, table, flags[, batched]) (a chat or completions stream chunk, no orjson at
 * all): None, or (text, tokens, finish_reason), what chat_step (completions_step) makes of orjson.loads(raw),
 * for the common chunk shape only; `batched`: a chunk with logprobs gives its tokens as a TokenBatch whose
 * tokens() are that list (no Token or Candidate built; a stream's message keeps and renders them as ids).
 *
 * What is read is parsed strictly: names and token strings plain ASCII, short numbers, every other
 * value validated as orjson would (check_value); anything outside that is declined, never guessed.
 * What split_body leaves to orjson is only walked (strings and brackets), never interpreted.
 * tests/test_body_scan.py holds both contracts (hypothesis over shapes, spellings and byte mutations).
 */
#include "_fastpath.h"

#define MAX_NUMBER_LENGTH 40  /* longer numbers are declined, never truncated */

typedef struct {
    const char *at;
    const char *end;
} Reader;

static inline int
is_space(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

static inline void
skip_space(Reader *r)
{
    /* Compact JSON (what servers send) has none: one test for the common case. */
    if (r->at < r->end && (unsigned char)*r->at > ' ') {
        return;
    }
    while (r->at < r->end && is_space(*r->at)) {
        r->at++;
    }
}

/* Skip white space, then take `c` if it is next. */
static inline int
take(Reader *r, char c)
{
    skip_space(r);
    if (r->at < r->end && *r->at == c) {
        r->at++;
        return 1;
    }
    return 0;
}

/* --- walking the body (not interpreted: orjson reads all of it but the cut value) --------------- */

/* Past the string that opens at r->at; 0 when it does not end. */
static int
pass_string(Reader *r)
{
    const char *p = r->at + 1;
    for (;;) {
        const char *quote = memchr(p, '"', (size_t)(r->end - p));
        if (quote == NULL) {
            return 0;
        }
        const char *run = quote;
        while (run > p && run[-1] == '\\') {
            run--;
        }
        if (((quote - run) & 1) == 0) { /* an even run of backslashes escapes itself, not the quote */
            r->at = quote + 1;
            return 1;
        }
        p = quote + 1;
    }
}

/* Past any value: a string, a bracketed value (to its matching bracket), or a number or literal (to the
 * next delimiter). 0 when the body ends first. */
static int
pass_value(Reader *r)
{
    skip_space(r);
    if (r->at >= r->end) {
        return 0;
    }
    char c = *r->at;
    if (c == '"') {
        return pass_string(r);
    }
    if (c == '{' || c == '[') {
        Py_ssize_t depth = 0;
        while (r->at < r->end) {
            c = *r->at;
            if (c == '"') {
                if (!pass_string(r)) {
                    return 0;
                }
                continue;
            }
            if (c == '{' || c == '[') {
                depth++;
            }
            else if ((c == '}' || c == ']') && --depth == 0) {
                r->at++;
                return 1;
            }
            r->at++;
        }
        return 0;
    }
    while (r->at < r->end && (c = *r->at) != ',' && c != '}' && c != ']' && c != ' ' && c != '\n' && c != '\r'
           && c != '\t') {
        r->at++;
    }
    return 1;
}

static inline int
is_name(const char *name, Py_ssize_t length, const char *wanted)
{
    return (size_t)length == strlen(wanted) && memcmp(name, wanted, (size_t)length) == 0;
}

/* --- the cut value, parsed strictly --------------------------------------------------------------- */

/* The characters a plain string may hold as they are: printable ASCII but the quote and the backslash. */
#define PLAIN_ROW(a) a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a
static const unsigned char PLAIN_CHARS[256] = {
    PLAIN_ROW(0), PLAIN_ROW(0),                                    /* 0x00-0x1F: control characters */
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,                /* 0x20-0x2F: not the quote */
    PLAIN_ROW(1), PLAIN_ROW(1),                                    /* 0x30-0x4F */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1,                /* 0x50-0x5F: not the backslash */
    PLAIN_ROW(1), PLAIN_ROW(1),                                    /* 0x60-0x7F */
    PLAIN_ROW(0), PLAIN_ROW(0), PLAIN_ROW(0), PLAIN_ROW(0),        /* 0x80-0xFF: not ASCII */
    PLAIN_ROW(0), PLAIN_ROW(0), PLAIN_ROW(0), PLAIN_ROW(0),
};
#undef PLAIN_ROW

static inline int
is_plain_char(unsigned char c)
{
    return PLAIN_CHARS[c];
}

/* A plain string: ASCII, printable, no escapes. */
static int
strict_string(Reader *r, const char **text, Py_ssize_t *length)
{
    skip_space(r);
    if (r->at >= r->end || *r->at != '"') {
        return 0;
    }
    const char *start = ++r->at, *p = start, *end = r->end;
    while (p < end && is_plain_char((unsigned char)*p)) {
        p++;
    }
    if (p >= end || *p != '"') {
        return 0; /* the end, a control character, non-ASCII or an escape */
    }
    *text = start;
    *length = p - start;
    r->at = p + 1;
    return 1;
}

/* A member name, plainly spelled (a plain string: see strict_string) and its colon. Escaped names
 * are declined: one could spell a name we look for. */
static int
read_name(Reader *r, const char **name, Py_ssize_t *length)
{
    return strict_string(r, name, length) && take(r, ':');
}

/* A number by JSON's grammar, short; `*is_float` when orjson reads it as a float (fraction or exponent).
 * Integers of up to 18 digits and exponents of up to 2 digits only: no question of range. */
static int
strict_number(Reader *r, const char **text, Py_ssize_t *length, int *is_float)
{
    skip_space(r);
    const char *p = r->at, *end = r->end;
    *is_float = 0;
    if (p < end && *p == '-') {
        p++;
    }
    const char *digits = p;
    if (p < end && *p == '0') {
        p++;
    }
    else if (p < end && *p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
        }
    }
    else {
        return 0;
    }
    Py_ssize_t integer_digits = p - digits;
    if (p < end && *p == '.') {
        *is_float = 1;
        const char *fraction = ++p;
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
        }
        if (p == fraction) {
            return 0;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *is_float = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-')) {
            p++;
        }
        const char *exponent = p;
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
        }
        if (p == exponent || p - exponent > 2) {
            return 0;
        }
    }
    if ((!*is_float && integer_digits > 18) || p - r->at > MAX_NUMBER_LENGTH) {
        return 0;
    }
    *text = r->at;
    *length = p - r->at;
    r->at = p;
    return 1;
}

static int
strict_literal(Reader *r, const char *word)
{
    size_t length = strlen(word);
    skip_space(r);
    if ((size_t)(r->end - r->at) < length || memcmp(r->at, word, length) != 0) {
        return 0;
    }
    r->at += length;
    return 1;
}

/* The rest of an array of small unsigned integers written without spaces (`bytes`: [72,105]), taken in one
 * tight loop; 0 with nothing consumed when the array is anything else. */
static int
small_integers(Reader *r)
{
    const char *p = r->at, *end = r->end;
    /* vLLM spells an alternative's bytes as those of its `token_id:N` placeholder (real 0.32 captures):
     * the values of `token_id:` then one per digit. That start is taken whole; a value must follow it. */
    static const char placeholder_start[] = "116,111,107,101,110,95,105,100,58,";
    if (end - p > (Py_ssize_t)sizeof placeholder_start
        && memcmp(p, placeholder_start, sizeof placeholder_start - 1) == 0) {
        p += sizeof placeholder_start - 1;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && defined(__GNUC__)
    /* Four bytes at a time: where the first non-digit is (each byte a digit when its high nibble is 3 and
     * adding 6 does not carry into it; a carry out of a byte only touches bytes after the first non-digit),
     * then that it is `,` or `]`. 1 to 3 digits, no leading zero; anything else goes the byte way below. */
    while (end - p >= 4) {
        uint32_t word, nibbles;
        memcpy(&word, p, sizeof word); /* p[0] is the lowest byte */
        nibbles = ((word & 0xF0F0F0F0u) ^ 0x30303030u) | (((word + 0x06060606u) & 0xF0F0F0F0u) ^ 0x30303030u);
        if (nibbles == 0) {
            return 0; /* four digits or more: not a byte value */
        }
        Py_ssize_t digits = __builtin_ctz(nibbles) >> 3;
        if (digits == 0 || (digits > 1 && p[0] == '0')) {
            return 0;
        }
        if (p[digits] == ',') {
            p += digits + 1;
            continue;
        }
        if (p[digits] == ']') {
            r->at = p + digits + 1;
            return 1;
        }
        return 0;
    }
#endif
    for (;;) {
        /* The same a byte at a time: the last bytes, or where words cannot be read as above. */
        const char *digits = p;
        while (p < end && *p >= '0' && *p <= '9' && p - digits < 4) {
            p++;
        }
        if (p == digits || p - digits == 4 || (*digits == '0' && p - digits > 1) || p == end) {
            return 0;
        }
        if (*p == ']') {
            r->at = p + 1;
            return 1;
        }
        if (*p++ != ',') {
            return 0;
        }
    }
}

static int check_value(Reader *r, int depth);

/* The id of a plain `token_id:N` string whose id has bytes in `table`, or -1 (what placeholder_id accepts). */
static Py_ssize_t
strict_placeholder(Reader *r, PyObject *table)
{
    const char *text;
    Py_ssize_t length;
    /* `"token_id:N"` read straight through: its digits to the closing quote (what fp_placeholder_text makes
     * of the plain string); anything else, and any text around it, is read as a string first. */
    const char *at = r->at, *end = r->end;
    if (end - at >= 12 && memcmp(at, "\"token_id:", 10) == 0) {
        const char *p = at + 10;
        Py_ssize_t size = PyTuple_GET_SIZE(table), id = 0;
        for (; p < end && (unsigned int)(*p - '0') <= 9; p++) {
            id = id * 10 + (*p - '0');
            if (id >= size) {
                return -1; /* only grows from here (leading zeros keep it small) */
            }
        }
        if (p > at + 10 && p < end && *p == '"') {
            r->at = p + 1;
            return PyTuple_GET_ITEM(table, id) == Py_None ? -1 : id;
        }
    }
    return strict_string(r, &text, &length) ? fp_placeholder_text(text, length, table) : -1;
}

/* A logprob as servers print it, `-?(0|[1-9][0-9]*)\.[0-9]+` with no exponent, read in one pass: 1 with its
 * value (what strict_number then fp_read_decimal make of the same text) and r->at past it; 0 with nothing
 * consumed for any other text, or for more than 19 significant digits (strict_logprob_value then reads it
 * as before). Scanning the number and then reading its digits again was 540 instructions a logprob. */
static int
plain_fraction(Reader *r, double *value)
{
    const unsigned char *start = (const unsigned char *)r->at, *end = (const unsigned char *)r->end;
    const unsigned char *p = start;
    int negative = p < end && *p == '-';
    p += negative;
    uint64_t digits = 0;
    int significant = 0;
    if (p < end && *p == '0') {
        p++;
    }
    else {
        const unsigned char *integer = p;
        if ((p = take_digits(p, end, &digits, &significant)) == NULL || p == integer) {
            return 0; /* no digit, or past 19 */
        }
    }
    if (p >= end || *p != '.') {
        return 0;
    }
    const unsigned char *fraction = ++p;
    if ((p = take_digits(p, end, &digits, &significant)) == NULL) {
        return 0;
    }
    if (p == fraction || (p < end && (*p == 'e' || *p == 'E')) || p - start > MAX_NUMBER_LENGTH
        || !fp_decimal_value(digits, (int)(p - fraction), negative, value)) {
        return 0;
    }
    r->at = (const char *)p;
    return 1;
}

/* A float logprob strictly between the sentinel and +inf (plain_logprob's rule) into *value: 1; 0 when it
 * is anything else (an error set only if reading failed). The usual spellings by plain_fraction or
 * fp_read_decimal, the rest by Python's own correctly rounded reader: either way the double orjson gives. */
static int
strict_logprob_value(Reader *r, double *result)
{
    const char *text;
    Py_ssize_t length;
    int is_float;
    char buffer[MAX_NUMBER_LENGTH + 1];
    double value;
    if (plain_fraction(r, &value)) {
        *result = value;
        return value > SENTINEL_LOGPROB && value < Py_HUGE_VAL;
    }
    if (!strict_number(r, &text, &length, &is_float) || !is_float) {
        return 0;
    }
    if (!fp_read_decimal((const unsigned char *)text, (const unsigned char *)text + length, &value)) {
        memcpy(buffer, text, (size_t)length);
        buffer[length] = '\0';
        char *stop;
        value = PyOS_string_to_double(buffer, &stop, NULL);
        if ((value == -1.0 && PyErr_Occurred()) || stop != buffer + length) {
            return 0;
        }
    }
    *result = value;
    return value > SENTINEL_LOGPROB && value < Py_HUGE_VAL;
}

/* The same as a new float; NULL when declined (no error set) or on an error. */
static PyObject *
strict_logprob(Reader *r)
{
    double value;
    return strict_logprob_value(r, &value) ? PyFloat_FromDouble(value) : NULL;
}

/* Set `bit` in *seen; 0 when it was set already (a repeated member: which one counts is orjson's business). */
static inline int
first_time_bit(int *seen, int bit)
{
    if (*seen & bit) {
        return 0;
    }
    *seen |= bit;
    return 1;
}

/* Reads one array item (a new reference), or NULL when declined (no error set) or on an error. */
typedef PyObject *(*ArrayItem)(Reader *r, void *context);

/* `[item, ...]`: each item read by `item` and appended to `list` (NULL: only counted, for items that are None:
 * records appended to a batch; a list of Nones cost ~65 instructions an item). How many, or -1 when declined (no
 * error set) or on an error. */
static Py_ssize_t
read_array(Reader *r, ArrayItem item, void *context, PyObject *list)
{
    if (!take(r, '[')) {
        return -1;
    }
    if (take(r, ']')) {
        return 0;
    }
    Py_ssize_t count = 0;
    do {
        PyObject *value = item(r, context);
        if (value == NULL || (list != NULL && PyList_Append(list, value) < 0)) {
            Py_XDECREF(value);
            return -1;
        }
        Py_DECREF(value);
        count++;
    } while (take(r, ','));
    return take(r, ']') ? count : -1;
}

/* `[item, ...]` -> a new list of what `item` reads; NULL when declined (no error set) or on an error. */
static PyObject *
array_of(Reader *r, ArrayItem item, void *context)
{
    PyObject *list = PyList_New(0);
    if (list != NULL && read_array(r, item, context, list) < 0) {
        Py_CLEAR(list);
    }
    return list;
}

/* The vocabulary a record reader needs; `special_flags` NULL for alternatives (candidates). With `batch`
 * (a TokenBatch, _fastpath_body.c) records are appended to it instead of built (each read gives None). */
typedef struct {
    PyObject *table;
    const char *special_flags;
    PyObject *batch;
} Tables;

static PyObject *strict_record(Reader *r, void *context);

enum { SEEN_TOKEN = 1, SEEN_LOGPROB = 2, SEEN_TOP = 4, SEEN_SPECIAL = 8 };

/* The members of a record strict_record tells apart (the rest are only checked). */
enum { MEMBER_OTHER, MEMBER_TOKEN, MEMBER_LOGPROB, MEMBER_ID, MEMBER_TOP, MEMBER_SPECIAL };

/* Take `"name":` when the text at r->at is exactly that (what read_name then is_name would find there). */
#define TAKE_NAME(r, quoted) \
    (memcmp((r)->at, quoted, sizeof(quoted) - 1) == 0 ? ((r)->at += sizeof(quoted) - 1, 1) : 0)

/* Which member's value comes next, its name and colon taken: MEMBER_*, or -1 when declined. The names
 * as servers write them (`"token":`, no white space) are matched whole, ~90 instructions less each than
 * reading the string and comparing it with every name; anything else goes through read_name. */
static int
record_member(Reader *r)
{
    if (r->end - r->at >= 16 && r->at[0] == '"') { /* 16: the longest name below, and its colon */
        switch (r->at[1]) {
        case 't':
            if (TAKE_NAME(r, "\"token\":")) {
                return MEMBER_TOKEN;
            }
            if (TAKE_NAME(r, "\"top_logprobs\":")) {
                return MEMBER_TOP;
            }
            break;
        case 'l':
            if (TAKE_NAME(r, "\"logprob\":")) {
                return MEMBER_LOGPROB;
            }
            break;
        case 'b':
            if (TAKE_NAME(r, "\"bytes\":")) {
                return MEMBER_OTHER;
            }
            break;
        }
    }
    const char *name;
    Py_ssize_t length;
    if (!read_name(r, &name, &length)) {
        return -1;
    }
    if (is_name(name, length, "token")) {
        return MEMBER_TOKEN;
    }
    if (is_name(name, length, "logprob")) {
        return MEMBER_LOGPROB;
    }
    if (is_name(name, length, "id")) {
        return MEMBER_ID;
    }
    if (is_name(name, length, "top_logprobs")) {
        return MEMBER_TOP;
    }
    return is_name(name, length, "special") ? MEMBER_SPECIAL : MEMBER_OTHER;
}

/* One content entry -> a Token (see chat_from_ids), or with `special_flags` NULL one of its alternatives
 * -> a Candidate (whose `top_logprobs` and `special` are members like any other); NULL when declined
 * (no error set) or on an error. */
static PyObject *
strict_record(Reader *r, void *context)
{
    const Tables *tables = context;
    PyObject *table = tables->table;
    Py_ssize_t id = -1;
    double value = 0;
    PyObject *logprob = NULL, *result = NULL, *listed = NULL;
    int seen = 0, special = 0, entry = tables->special_flags != NULL;
    Py_ssize_t listed_count = 0; /* the alternatives read (`listed`'s length, or counted into the batch) */
    if (!take(r, '{')) {
        return NULL;
    }
    if (!take(r, '}')) {
        do {
            int member = record_member(r);
            if (member < 0 || member == MEMBER_ID) { /* MEMBER_ID: llama.cpp's ids are read by Python */
                goto done;
            }
            if (member == MEMBER_TOKEN) {
                if (!first_time_bit(&seen, SEEN_TOKEN) || (id = strict_placeholder(r, table)) < 0) {
                    goto done;
                }
            }
            else if (member == MEMBER_LOGPROB) {
                if (!first_time_bit(&seen, SEEN_LOGPROB) || !strict_logprob_value(r, &value)) {
                    goto done;
                }
            }
            else if (entry && member == MEMBER_TOP) {
                Tables alternatives = {table, NULL, tables->batch};
                if (!first_time_bit(&seen, SEEN_TOP)) {
                    goto done;
                }
                /* null reads as none; any other non-array is Python's call (it may read it as none or refuse) */
                if (strict_literal(r, "null")) {
                    continue;
                }
                if (tables->batch != NULL) {
                    if ((listed_count = read_array(r, strict_record, &alternatives, NULL)) < 0) {
                        goto done;
                    }
                }
                else if ((listed = array_of(r, strict_record, &alternatives)) == NULL) {
                    goto done;
                }
            }
            else if (entry && member == MEMBER_SPECIAL) {
                if (!first_time_bit(&seen, SEEN_SPECIAL)) {
                    goto done;
                }
                if (strict_literal(r, "true")) {
                    special = 1;
                }
                else if (!check_value(r, 1)) {
                    goto done;
                }
            }
            else if (!check_value(r, 1)) {
                goto done;
            }
        } while (take(r, ','));
        if (!take(r, '}')) {
            goto done;
        }
    }
    if (listed != NULL) {
        listed_count = PyList_GET_SIZE(listed);
    }
    if ((seen & (SEEN_TOKEN | SEEN_LOGPROB)) != (SEEN_TOKEN | SEEN_LOGPROB) || listed_count > MAX_CANDIDATES) {
        goto done;
    }
    if (tables->batch != NULL) {
        int added = entry ? fp_batch_token(tables->batch, id, value, special || tables->special_flags[id] != 0, 0, -1)
                          : fp_batch_alternative(tables->batch, id, value);
        result = added < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    if ((logprob = PyFloat_FromDouble(value)) == NULL) {
        goto done;
    }
    if (!entry) {
        result = fp_candidate(PyTuple_GET_ITEM(table, id), logprob, id);
        goto done;
    }
    PyObject *top = fp_untracked(listed == NULL ? PyTuple_New(0) : PyList_AsTuple(listed));
    if (top != NULL) {
        result = fp_token(PyTuple_GET_ITEM(table, id), logprob, top, id,
                          special || tables->special_flags[id] != 0, 0);
        Py_DECREF(top);
    }
done:
    Py_XDECREF(listed);
    Py_XDECREF(logprob);
    return result;
}

/* `{"content": [entries]}` -> a list of Tokens (with `batch`: the batch, the records appended); NULL when declined
 * or on an error. */
static PyObject *
strict_logprobs(Reader *r, PyObject *table, const char *special_flags, PyObject *batch)
{
    const char *name;
    Py_ssize_t name_length;
    Tables entries = {table, special_flags, batch};
    if (!take(r, '{') || !read_name(r, &name, &name_length) || !is_name(name, name_length, "content")) {
        return NULL;
    }
    /* With a batch the records go there: the batch itself is the result, as completions_logprobs gives it */
    PyObject *tokens = batch != NULL ? (read_array(r, strict_record, &entries, NULL) < 0 ? NULL : Py_NewRef(batch))
                                     : array_of(r, strict_record, &entries);
    if (tokens == NULL) {
        return NULL;
    }
    if (!take(r, '}')) {
        Py_DECREF(tokens);
        return NULL; /* another member beside content: Python's */
    }
    return tokens;
}

/* Walk `{..., "choices": [{..., "logprobs": <value>, ...}, ...], ...}` to the first choice's logprobs
 * and read it. NULL when declined or on an error; the value's span in *value_start, *value_end. */
static PyObject *completions_logprobs(Reader *r, PyObject *table, const char *special_flags, PyObject *batch);

/* (`completions`: the value is legacy completions logprobs, read by completions_logprobs; `batch`: records go
 * there, see Tables.) */
static PyObject *
first_choice_logprobs(Reader *r, const char *base, PyObject *table, const char *special_flags,
                      Py_ssize_t *value_start, Py_ssize_t *value_end, int completions, PyObject *batch)
{
    const char *name;
    Py_ssize_t name_length;
    PyObject *tokens = NULL;
    int choices_seen = 0;
    if (!take(r, '{') || take(r, '}')) {
        return NULL;
    }
    do {
        if (!read_name(r, &name, &name_length)) {
            goto fail;
        }
        if (!is_name(name, name_length, "choices")) {
            if (!pass_value(r)) {
                goto fail;
            }
            continue;
        }
        if (choices_seen++ || !take(r, '[') || !take(r, '{') || take(r, '}')) {
            goto fail; /* a repeated name (which one counts is orjson's business), or no first choice */
        }
        int logprobs_seen = 0;
        do {
            if (!read_name(r, &name, &name_length)) {
                goto fail;
            }
            if (!is_name(name, name_length, "logprobs")) {
                if (!pass_value(r)) {
                    goto fail;
                }
                continue;
            }
            if (logprobs_seen++) {
                goto fail;
            }
            skip_space(r);
            *value_start = r->at - base;
            tokens = completions ? completions_logprobs(r, table, special_flags, batch)
                                 : strict_logprobs(r, table, special_flags, batch);
            if (tokens == NULL) {
                return NULL;
            }
            *value_end = r->at - base;
        } while (take(r, ','));
        if (!take(r, '}')) {
            goto fail;
        }
        while (take(r, ',')) { /* the other choices */
            if (!pass_value(r)) {
                goto fail;
            }
        }
        if (!take(r, ']')) {
            goto fail;
        }
    } while (take(r, ','));
    if (!take(r, '}') || tokens == NULL) {
        goto fail;
    }
    skip_space(r);
    if (r->at != r->end) {
        goto fail;
    }
    return tokens;
fail:
    Py_XDECREF(tokens);
    return NULL;
}

/* `raw` with raw[value_start:value_end] replaced by `null` (a new reference). */
static PyObject *
without_value(PyObject *raw, Py_ssize_t value_start, Py_ssize_t value_end)
{
    const char *base = PyBytes_AS_STRING(raw);
    Py_ssize_t tail = PyBytes_GET_SIZE(raw) - value_end;
    PyObject *body = PyBytes_FromStringAndSize(NULL, value_start + 4 + tail);
    if (body != NULL) {
        char *out = PyBytes_AS_STRING(body);
        memcpy(out, base, (size_t)value_start);
        memcpy(out + value_start, "null", 4);
        memcpy(out + value_start + 4, base + value_end, (size_t)tail);
    }
    return body;
}

/* --- a whole stream chunk, validated here (no orjson at all) ------------------------------------------ */

#define MAX_CHECK_DEPTH 32

static inline int
hex_value(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The code point of the four hex digits at p, or -1. */
static inline long
hex4(const char *p)
{
    long value = 0;
    for (int i = 0; i < 4; i++) {
        int digit = hex_value(p[i]);
        if (digit < 0) {
            return -1;
        }
        value = value * 16 + digit;
    }
    return value;
}

/* Any JSON string orjson accepts (well-formed UTF-8, no raw control characters, valid escapes; a lone
 * surrogate escape is declined). With `out`, also its value as a str. 0 when declined or on an error
 * (then set). */
static int
text_string(Reader *r, PyObject **out)
{
    skip_space(r);
    if (r->at >= r->end || *r->at != '"') {
        return 0;
    }
    const unsigned char *start = (const unsigned char *)++r->at, *p = start, *end = (const unsigned char *)r->end;
    int escaped = 0;
    while (p < end && *p != '"') {
        unsigned char c = *p;
        if (c < 0x20) {
            return 0;
        }
        if (c >= 0x80) {
            Py_ssize_t length = utf8_sequence(p, end - p);
            if (length == 0) {
                return 0;
            }
            p += length;
            continue;
        }
        if (c != '\\') {
            p++;
            continue;
        }
        escaped = 1;
        if (p + 1 >= end) {
            return 0;
        }
        if (p[1] != 'u') {
            if (strchr("\"\\/bfnrt", p[1]) == NULL || p[1] == '\0') {
                return 0;
            }
            p += 2;
            continue;
        }
        if (end - p < 6) {
            return 0;
        }
        long unit = hex4((const char *)p + 2);
        if (unit < 0 || (unit >= 0xDC00 && unit <= 0xDFFF)) {
            return 0;
        }
        if (unit >= 0xD800 && unit <= 0xDBFF) { /* only as the first of a pair */
            if (end - p < 12 || p[6] != '\\' || p[7] != 'u') {
                return 0;
            }
            long low = hex4((const char *)p + 8);
            if (low < 0xDC00 || low > 0xDFFF) {
                return 0;
            }
            p += 6;
        }
        p += 6;
    }
    if (p >= end) {
        return 0;
    }
    r->at = (const char *)p + 1;
    if (out == NULL) {
        return 1;
    }
    Py_ssize_t length = p - start;
    if (!escaped) {
        *out = PyUnicode_DecodeUTF8((const char *)start, length, NULL);
        return *out != NULL;
    }
    /* Unescape into UTF-8 (never longer than the escaped text), then decode. */
    char *buffer = PyMem_Malloc((size_t)length + 1), *w = buffer;
    if (buffer == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    for (const unsigned char *q = start; q < p;) {
        if (*q != '\\') {
            *w++ = (char)*q++;
            continue;
        }
        char kind = (char)q[1];
        if (kind != 'u') {
            *w++ = kind == 'b' ? '\b' : kind == 'f' ? '\f' : kind == 'n' ? '\n' : kind == 'r' ? '\r' : kind == 't' ? '\t' : kind;
            q += 2;
            continue;
        }
        long code = hex4((const char *)q + 2);
        q += 6;
        if (code >= 0xD800 && code <= 0xDBFF) {
            code = 0x10000 + ((code - 0xD800) << 10) + (hex4((const char *)q + 2) - 0xDC00);
            q += 6;
        }
        if (code < 0x80) {
            *w++ = (char)code;
        }
        else if (code < 0x800) {
            *w++ = (char)(0xC0 | (code >> 6));
            *w++ = (char)(0x80 | (code & 0x3F));
        }
        else if (code < 0x10000) {
            *w++ = (char)(0xE0 | (code >> 12));
            *w++ = (char)(0x80 | ((code >> 6) & 0x3F));
            *w++ = (char)(0x80 | (code & 0x3F));
        }
        else {
            *w++ = (char)(0xF0 | (code >> 18));
            *w++ = (char)(0x80 | ((code >> 12) & 0x3F));
            *w++ = (char)(0x80 | ((code >> 6) & 0x3F));
            *w++ = (char)(0x80 | (code & 0x3F));
        }
    }
    *out = PyUnicode_DecodeUTF8(buffer, w - buffer, NULL);
    PyMem_Free(buffer);
    return *out != NULL;
}

/* Any value orjson accepts, within limits (short numbers, bounded depth): 0 when declined. */
static int
check_value(Reader *r, int depth)
{
    const char *text;
    Py_ssize_t length;
    int is_float;
    skip_space(r);
    if (r->at >= r->end || depth > MAX_CHECK_DEPTH) {
        return 0;
    }
    switch (*r->at) {
    case '"':
        return text_string(r, NULL);
    case 't':
        return strict_literal(r, "true");
    case 'f':
        return strict_literal(r, "false");
    case 'n':
        return strict_literal(r, "null");
    case '[':
        r->at++;
        if (small_integers(r) || take(r, ']')) {
            return 1;
        }
        do {
            if (!check_value(r, depth + 1)) {
                return 0;
            }
        } while (take(r, ','));
        return take(r, ']');
    case '{':
        r->at++;
        if (take(r, '}')) {
            return 1;
        }
        do {
            if (!text_string(r, NULL) || !take(r, ':') || !check_value(r, depth + 1)) {
                return 0;
            }
        } while (take(r, ','));
        return take(r, '}');
    default:
        return strict_number(r, &text, &length, &is_float);
    }
}

/* Walk an object's members: `visit(r, name, length, state)` reads the value of each (1: read, 0: declined,
 * -1: an error is set). 1 when the whole object was read. */
typedef int (*MemberVisitor)(Reader *r, const char *name, Py_ssize_t length, void *state);

static int
each_member(Reader *r, MemberVisitor visit, void *state)
{
    const char *name;
    Py_ssize_t length;
    if (!take(r, '{')) {
        return 0;
    }
    if (take(r, '}')) {
        return 1;
    }
    do {
        if (!read_name(r, &name, &length)) {
            return 0;
        }
        int read = visit(r, name, length, state);
        if (read <= 0) {
            return read;
        }
    } while (take(r, ','));
    return take(r, '}');
}


/* One position's `{"token_id:N": logprob, ...}` -> a tuple of Candidates in the object's order (with a
 * `batch`: appended to it, and their count as an int); NULL when declined (a repeated id: orjson would keep
 * one) or on an error. */
static PyObject *
top_dict(Reader *r, PyObject *table, PyObject *batch)
{
    PyObject *candidates[MAX_CANDIDATES];
    Py_ssize_t ids[MAX_CANDIDATES], count = 0;
    PyObject *result = NULL;
    if (!take(r, '{')) {
        return NULL;
    }
    if (!take(r, '}')) {
        do {
            if (count == MAX_CANDIDATES) {
                goto done;
            }
            Py_ssize_t id = strict_placeholder(r, table);
            if (id < 0 || !take(r, ':')) {
                goto done;
            }
            for (Py_ssize_t i = 0; i < count; i++) {
                if (ids[i] == id) {
                    goto done;
                }
            }
            double value;
            if (!strict_logprob_value(r, &value)) {
                goto done;
            }
            if (batch != NULL) {
                if (fp_batch_alternative(batch, id, value) < 0) {
                    goto done;
                }
                ids[count++] = id;
                continue;
            }
            PyObject *logprob = PyFloat_FromDouble(value);
            if (logprob == NULL) {
                goto done;
            }
            candidates[count] = fp_candidate(PyTuple_GET_ITEM(table, id), logprob, id);
            Py_DECREF(logprob);
            if (candidates[count] == NULL) {
                goto done;
            }
            ids[count++] = id;
        } while (take(r, ','));
        if (!take(r, '}')) {
            goto done;
        }
    }
    if (batch != NULL) {
        result = PyLong_FromSsize_t(count);
        count = 0; /* nothing of ours to release */
        goto done;
    }
    result = fp_untracked(PyTuple_New(count));
    if (result != NULL) {
        for (Py_ssize_t i = 0; i < count; i++) {
            PyTuple_SET_ITEM(result, i, candidates[i]); /* steals */
        }
        count = 0;
    }
done:
    if (batch == NULL) {
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_DECREF(candidates[i]);
        }
    }
    return result;
}

typedef struct {
    PyObject *table;
    const char *special_flags;
    int completions; /* a legacy completions chunk (`text`, array logprobs) rather than a chat one */
    PyObject *text, *tokens, *finish_reason; /* owned; NULL until read */
    int seen;
    int batched; /* the tokens as a TokenBatch (_fastpath_body.c), not a list of Tokens */
} Chunk;

enum { SEEN_CHOICES = 1, SEEN_DELTA = 2, SEEN_CONTENT = 4, SEEN_LOGPROBS = 8, SEEN_FINISH = 16, SEEN_TOOL_CALLS = 32,
       SEEN_USAGE = 64, SEEN_ERROR = 128 };

/* Claim a member once: 0 when it came before (declined: which one counts is orjson's business). */
static inline int
first_time(Chunk *chunk, int bit)
{
    return first_time_bit(&chunk->seen, bit);
}

static inline int
failed(void)
{
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *
placeholder_item(Reader *r, void *table)
{
    Py_ssize_t id = strict_placeholder(r, table);
    return id < 0 ? NULL : PyLong_FromSsize_t(id);
}

static PyObject *
logprob_or_null(Reader *r, void *context)
{
    return strict_literal(r, "null") ? Py_NewRef(Py_None) : strict_logprob(r);
}

static PyObject *
top_dict_or_null(Reader *r, void *context)
{
    const Tables *tables = context;
    return strict_literal(r, "null") ? Py_NewRef(Py_None) : top_dict(r, tables->table, tables->batch);
}

/* Completions logprobs `{"tokens": [...], "token_logprobs": [...], "top_logprobs": [{...}], "text_offset": [...]}`
 * -> Tokens, exactly what completions_from_ids makes of them (see parse._completions_from_ids); NULL
 * when declined (no error set) or on an error. */
static PyObject *
completions_logprobs(Reader *r, PyObject *table, const char *special_flags, PyObject *batch)
{
    Tables tables = {table, NULL, batch};
    const char *name;
    Py_ssize_t name_length;
    /* ids: the tokens' ids; values: floats or None; tops: a tuple of candidates or None per position */
    PyObject *ids = NULL, *values = NULL, *tops = NULL, *tokens = NULL;
    int seen = 0;
    if (!take(r, '{')) {
        return NULL;
    }
    if (!take(r, '}')) {
        do {
            if (!read_name(r, &name, &name_length)) {
                goto done;
            }
            if (is_name(name, name_length, "tokens")) {
                if (!first_time_bit(&seen, 1) || (ids = array_of(r, placeholder_item, table)) == NULL) {
                    goto done;
                }
            }
            else if (is_name(name, name_length, "token_logprobs")) {
                if (!first_time_bit(&seen, 2) || (values = array_of(r, logprob_or_null, NULL)) == NULL) {
                    goto done;
                }
            }
            else if (is_name(name, name_length, "top_logprobs")) {
                if (!first_time_bit(&seen, 4)
                    || (!strict_literal(r, "null") && (tops = array_of(r, top_dict_or_null, &tables)) == NULL)) {
                    goto done;
                }
            }
            else if (!check_value(r, 2)) {
                goto done;
            }
        } while (take(r, ','));
        if (!take(r, '}')) {
            goto done;
        }
    }
    /* Python reads a missing `tokens` or `token_logprobs` as empty, and refuses arrays of different lengths. */
    Py_ssize_t count = ids == NULL ? 0 : PyList_GET_SIZE(ids);
    if ((values == NULL ? 0 : PyList_GET_SIZE(values)) != count || (tops != NULL && PyList_GET_SIZE(tops) != count)) {
        goto done;
    }
    if (batch != NULL) {
        /* The batch holds every position's alternatives in order: each ends where its count says. */
        Py_ssize_t alternatives_end = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *value = PyList_GET_ITEM(values, i), *top = tops == NULL ? Py_None : PyList_GET_ITEM(tops, i);
            Py_ssize_t id = PyLong_AsSsize_t(PyList_GET_ITEM(ids, i));
            if (value == Py_None) {
                goto done; /* an echoed prompt's first token: Python's */
            }
            alternatives_end += top == Py_None ? 0 : PyLong_AsSsize_t(top);
            if (fp_batch_token(batch, id, PyFloat_AS_DOUBLE(value), special_flags[id] != 0, top == Py_None,
                               alternatives_end) < 0) {
                goto done;
            }
        }
        tokens = Py_NewRef(batch);
        goto done;
    }
    tokens = PyList_New(count);
    if (tokens == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t id = PyLong_AsSsize_t(PyList_GET_ITEM(ids, i)); /* a small int made above: cannot fail */
        PyObject *top = tops == NULL ? Py_None : PyList_GET_ITEM(tops, i);
        PyObject *empty = NULL;
        if (top == Py_None && (empty = PyTuple_New(0)) == NULL) {
            Py_CLEAR(tokens);
            goto done;
        }
        PyObject *record = fp_token(PyTuple_GET_ITEM(table, id), PyList_GET_ITEM(values, i),
                                    top == Py_None ? empty : top, id, special_flags[id] != 0, top == Py_None);
        Py_XDECREF(empty);
        if (record == NULL) {
            Py_CLEAR(tokens);
            goto done;
        }
        PyList_SET_ITEM(tokens, i, record);
    }
done:
    Py_XDECREF(ids);
    Py_XDECREF(values);
    Py_XDECREF(tops);
    return tokens;
}

/* `delta`: `content` (a string or null) and nothing of a reasoning parser or a tool call. */
static int
delta_member(Reader *r, const char *name, Py_ssize_t length, void *state)
{
    Chunk *chunk = state;
    if (is_name(name, length, "content")) {
        if (!first_time(chunk, SEEN_CONTENT)) {
            return 0;
        }
        if (strict_literal(r, "null")) {
            return 1;
        }
        return text_string(r, &chunk->text) ? 1 : failed();
    }
    if (is_name(name, length, "tool_calls")) {
        return first_time(chunk, SEEN_TOOL_CALLS) && strict_literal(r, "null");
    }
    if (is_name(name, length, "reasoning") || is_name(name, length, "reasoning_content")) {
        return 0; /* a thinking step: Python's */
    }
    return check_value(r, 2);
}

/* The chunk's logprobs value into a new small TokenBatch, chunk->tokens: 1; 0 declined, -1 on an error. The same
 * records the list readers accept, appended instead of built (the batch's tokens() are the list's Tokens). */
static int
batched_logprobs(Reader *r, Chunk *chunk)
{
    PyObject *batch = fp_batch_new_small(chunk->table);
    if (batch == NULL) {
        return -1;
    }
    PyObject *read = chunk->completions ? completions_logprobs(r, chunk->table, chunk->special_flags, batch)
                                        : strict_logprobs(r, chunk->table, chunk->special_flags, batch);
    if (read == NULL) {
        Py_DECREF(batch);
        return failed();
    }
    Py_DECREF(read); /* the batch itself */
    chunk->tokens = batch;
    return 1;
}

static int
choice_member(Reader *r, const char *name, Py_ssize_t length, void *state)
{
    Chunk *chunk = state;
    if (!chunk->completions && is_name(name, length, "delta")) {
        if (!first_time(chunk, SEEN_DELTA)) {
            return 0;
        }
        int read = each_member(r, delta_member, chunk);
        return read > 0 ? 1 : read < 0 ? -1 : failed();
    }
    if (chunk->completions && is_name(name, length, "text")) {
        if (!first_time(chunk, SEEN_CONTENT)) {
            return 0;
        }
        if (strict_literal(r, "null")) {
            return 1;
        }
        return text_string(r, &chunk->text) ? 1 : failed();
    }
    if (is_name(name, length, "logprobs")) {
        if (!first_time(chunk, SEEN_LOGPROBS)) {
            return 0;
        }
        if (strict_literal(r, "null")) {
            return 1;
        }
        if (chunk->batched) {
            return batched_logprobs(r, chunk);
        }
        chunk->tokens = chunk->completions ? completions_logprobs(r, chunk->table, chunk->special_flags, NULL)
                                           : strict_logprobs(r, chunk->table, chunk->special_flags, NULL);
        return chunk->tokens != NULL ? 1 : failed();
    }
    if (is_name(name, length, "finish_reason")) {
        if (!first_time(chunk, SEEN_FINISH)) {
            return 0;
        }
        if (strict_literal(r, "null")) {
            return 1;
        }
        return text_string(r, &chunk->finish_reason) ? 1 : failed();
    }
    return check_value(r, 2);
}

static int
chunk_member(Reader *r, const char *name, Py_ssize_t length, void *state)
{
    Chunk *chunk = state;
    if (is_name(name, length, "choices")) {
        if (!first_time(chunk, SEEN_CHOICES) || !take(r, '[')) {
            return 0;
        }
        int read = each_member(r, choice_member, chunk);
        if (read <= 0) {
            return read < 0 ? -1 : failed();
        }
        while (take(r, ',')) { /* the other choices */
            if (!check_value(r, 1)) {
                return 0;
            }
        }
        return take(r, ']');
    }
    if (is_name(name, length, "usage")) {
        return first_time(chunk, SEEN_USAGE) && strict_literal(r, "null");
    }
    if (is_name(name, length, "error")) {
        return first_time(chunk, SEEN_ERROR) && strict_literal(r, "null");
    }
    return check_value(r, 1);
}

/* A stream chunk of the common shape -> (text, tokens, finish_reason), exactly what chat_step (or with
 * `completions` true, completions_step) makes of orjson.loads(raw) for its Step; None for any other
 * chunk (the usage chunk, tool calls, reasoning, logprobs not plainly `token_id:N`, anything orjson
 * would refuse) and Python reads it. */
PyObject *
fp_read_chunk(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 4 && nargs != 5) || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "read_chunk(raw: bytes, completions: bool, table, special_flags, batched: bool = False)");
        return NULL;
    }
    if (fp_check_ready(args[2], args[3]) < 0) {
        return NULL;
    }
    const char *base = PyBytes_AS_STRING(args[0]);
    Reader reader = {base, base + PyBytes_GET_SIZE(args[0])};
    Chunk chunk = {args[2], PyBytes_AS_STRING(args[3]), PyObject_IsTrue(args[1]), NULL, NULL, NULL, 0,
                   nargs == 5 && PyObject_IsTrue(args[4])};
    PyObject *result = NULL;
    int read = each_member(&reader, chunk_member, &chunk);
    skip_space(&reader);
    if (read > 0 && reader.at == reader.end && (chunk.seen & (chunk.completions ? SEEN_CHOICES : SEEN_DELTA))) {
        if (chunk.text == NULL) {
            chunk.text = PyUnicode_New(0, 0);
        }
        if (chunk.tokens == NULL) {
            chunk.tokens = PyList_New(0);
        }
        if (chunk.text != NULL && chunk.tokens != NULL) {
            result = PyTuple_Pack(3, chunk.text, chunk.tokens, chunk.finish_reason ? chunk.finish_reason : Py_None);
        }
    }
    else if (!PyErr_Occurred()) {
        result = Py_NewRef(Py_None);
    }
    Py_XDECREF(chunk.text);
    Py_XDECREF(chunk.tokens);
    Py_XDECREF(chunk.finish_reason);
    return result;
}

/* A whole chat (or with `completions`, legacy completions) body whose first choice's logprobs are plainly
 * `token_id:N` -> (body, batch): `body` is `raw` with that logprobs value replaced by `null`, `batch` a TokenBatch of exactly the Tokens chat_from_ids (completions_from_ids)
 * makes of that value read by orjson; None for any other body (Python reads it). */
PyObject *
fp_split_body(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "split_body(raw: bytes, completions: bool, table, special_flags)");
        return NULL;
    }
    PyObject *raw = args[0], *table = args[2], *flags = args[3];
    if (fp_check_ready(table, flags) < 0) {
        return NULL;
    }
    int completions = PyObject_IsTrue(args[1]);
    if (completions < 0) {
        return NULL;
    }
    PyObject *batch = fp_batch_new(table);
    if (batch == NULL) {
        return NULL;
    }
    const char *base = PyBytes_AS_STRING(raw);
    Reader reader = {base, base + PyBytes_GET_SIZE(raw)};
    Py_ssize_t value_start = 0, value_end = 0;
    PyObject *read = first_choice_logprobs(&reader, base, table, PyBytes_AS_STRING(flags), &value_start, &value_end,
                                           completions, batch);
    if (read == NULL) {
        Py_DECREF(batch);
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    Py_DECREF(read);
    PyObject *body = without_value(raw, value_start, value_end);
    if (body == NULL) {
        Py_DECREF(batch);
        return NULL;
    }
    return Py_BuildValue("(NN)", body, batch);
}

/* --- a stream's events ------------------------------------------------------------------------------ */

/* Whether [text, text + length) stripped of ASCII white space (bytes.strip) is `[DONE]`. */
static int
is_done_event(const char *text, Py_ssize_t length)
{
    static const char white[] = " \t\n\r\x0b\x0c";
    while (length > 0 && memchr(white, text[0], sizeof white - 1) != NULL) {
        text++, length--;
    }
    while (length > 0 && memchr(white, text[length - 1], sizeof white - 1) != NULL) {
        length--;
    }
    return length == 6 && memcmp(text, "[DONE]", 6) == 0;
}

/* fp_sse_events(read): one network read of an upstream's event stream, from an event's start: whole events,
 * each one `data:` line then its blank line (what servers write: one flush per event), then at most the
 * start of a line -> (payloads, done, cut), what sse._events makes of the events' lines: each event's
 * data, up to a `[DONE]` event (`done`), and where the unread start of a line begins (`cut`, the read's
 * length when there is none). None for any other read (an event cut after a line end, a CR, a field other
 * than data, data on several lines, an error line): sse.py reads it line by line. One memchr per line
 * here, against bytes.split walking the read a byte at a time and a Python loop over its lines. */
PyObject *
fp_sse_events(PyObject *module, PyObject *raw)
{
    if (!PyBytes_CheckExact(raw)) {
        PyErr_SetString(PyExc_TypeError, "sse_events(read: bytes)");
        return NULL;
    }
    const char *start = PyBytes_AS_STRING(raw), *p = start, *end = p + PyBytes_GET_SIZE(raw);
    if (memchr(p, '\r', (size_t)(end - p)) != NULL) {
        Py_RETURN_NONE;
    }
    PyObject *payloads = PyList_New(0);
    if (payloads == NULL) {
        return NULL;
    }
    int done = 0;
    while (p < end) {
        const char *newline = memchr(p, '\n', (size_t)(end - p));
        if (newline == NULL) {
            break; /* the start of a line: the caller keeps it for the next read */
        }
        if (newline == p) { /* a blank line with no event open */
            p++;
            continue;
        }
        /* `data:` (and one space), its line, then the blank line that ends the event */
        if (newline - p < 5 || memcmp(p, "data:", 5) != 0 || newline + 1 == end || newline[1] != '\n') {
            Py_DECREF(payloads);
            Py_RETURN_NONE;
        }
        const char *data = p + 5 + (newline - p > 5 && p[5] == ' ');
        if (is_done_event(data, newline - data)) {
            done = 1;
            break;
        }
        PyObject *payload = PyBytes_FromStringAndSize(data, newline - data);
        if (payload == NULL || PyList_Append(payloads, payload) < 0) {
            Py_XDECREF(payload);
            Py_DECREF(payloads);
            return NULL;
        }
        Py_DECREF(payload);
        p = newline + 2;
    }
    return Py_BuildValue("(NOn)", payloads, done ? Py_True : Py_False, (Py_ssize_t)(p - start));
}
