/* What the compiled twins share (_fastpath.c: records and renderers; _fastpath_json.c: the body scanner). */
#ifndef RESPONSES_GATEWAY_FASTPATH_H
#define RESPONSES_GATEWAY_FASTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
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

/* A Candidate / Token of Origin.TOKEN_ID (new references; borrowed arguments). */
PyObject *fp_candidate(PyObject *data, PyObject *logprob, Py_ssize_t id);
PyObject *fp_token(PyObject *data, PyObject *logprob, PyObject *top, Py_ssize_t id, int special, int top_absent);
int fp_check_ready(PyObject *table, PyObject *flags);

/* _fastpath_json.c */
PyObject *fp_split_chat_logprobs(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
