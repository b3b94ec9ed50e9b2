/* Decode stage, native part, for the pixel cache (fastload/pixels/): its index's entries.
 *
 * The index is a file every process of a node maps: a header, then four 64-bit words per record.
 * Word 0 is written last, with release order, and read first, with acquire order: a reader that
 * sees it sees the other three words, and the pixels its writer put in the data file before it
 * (a pwrite before the store), on any CPU, x86's stronger order or Arm's weaker one alike. A
 * process killed before that store leaves no entry; one killed after it left whole pixels.
 */
#include "pixel_native.h"

#include <stdint.h>
#include <string.h>

#define ENTRY_WORDS 4

/* The index's entries as words: base and count, or NULL with an exception set. */
static uint64_t *entry_words(Py_buffer *index, Py_ssize_t header_bytes, Py_ssize_t *count) {
    if (header_bytes < 0 || header_bytes % (ENTRY_WORDS * 8) != 0 || header_bytes > index->len ||
        ((uintptr_t)index->buf % 8) != 0) {
        PyErr_Format(PyExc_ValueError, "pixel index: a header of %zd bytes does not fit an index of %zd",
                     header_bytes, index->len);
        return NULL;
    }
    *count = (index->len - header_bytes) / (ENTRY_WORDS * 8);
    return (uint64_t *)((unsigned char *)index->buf + header_bytes);
}

const char fastload_pixel_entries_doc[] =
    "pixel_entries(index, header_bytes, records, out)\n\n"
    "Copy the entries of ``records`` (int64) from the pixel cache's ``index`` (a buffer: its\n"
    "header, then 4 uint64 words a record) into ``out`` (a writable uint64 array, 4 words a\n"
    "record): word 0 read with acquire order, so the other words and the pixels are there when it\n"
    "is not 0; a record without an entry gets 4 zeros.";

PyObject *fastload_pixel_entries(PyObject *self, PyObject *args) {
    Py_buffer index, records, out;
    Py_ssize_t header_bytes, count, n, k;
    uint64_t *words;
    const int64_t *wanted;
    uint64_t *into;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*ny*w*", &index, &header_bytes, &records, &out)) {
        return NULL;
    }
    words = entry_words(&index, header_bytes, &count);
    n = records.len / 8;
    if (words != NULL && (records.len % 8 != 0 || out.len < n * ENTRY_WORDS * 8)) {
        PyErr_SetString(PyExc_ValueError, "pixel_entries: records must be int64 and out 4 uint64 a record");
        words = NULL;
    }
    wanted = (const int64_t *)records.buf;
    into = (uint64_t *)out.buf;
    for (k = 0; words != NULL && k < n; k++) {
        if (wanted[k] < 0 || wanted[k] >= count) {
            PyErr_Format(PyExc_IndexError, "pixel_entries: record %lld is outside the index of %zd",
                         (long long)wanted[k], count);
            words = NULL;
            break;
        }
        {
            uint64_t *entry = words + wanted[k] * ENTRY_WORDS;
            uint64_t first = __atomic_load_n(entry, __ATOMIC_ACQUIRE);
            int w;
            into[k * ENTRY_WORDS] = first;
            for (w = 1; w < ENTRY_WORDS; w++) {
                into[k * ENTRY_WORDS + w] = first ? __atomic_load_n(entry + w, __ATOMIC_RELAXED) : 0;
            }
        }
    }
    PyBuffer_Release(&index);
    PyBuffer_Release(&records);
    PyBuffer_Release(&out);
    if (words == NULL) {
        return NULL;
    }
    Py_RETURN_NONE;
}

const char fastload_pixel_publish_doc[] =
    "pixel_publish(index, header_bytes, record, w0, w1, w2, w3)\n\n"
    "Publish ``record``'s entry in the pixel cache's ``index`` (a writable buffer): words 1 to 3\n"
    "first, then word 0 (not 0) with release order, after everything this thread wrote before.";

PyObject *fastload_pixel_publish(PyObject *self, PyObject *args) {
    Py_buffer index;
    Py_ssize_t header_bytes, record, count;
    unsigned long long w[ENTRY_WORDS];
    uint64_t *words;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*nnKKKK", &index, &header_bytes, &record, &w[0], &w[1], &w[2],
                          &w[3])) {
        return NULL;
    }
    words = entry_words(&index, header_bytes, &count);
    if (words != NULL && (record < 0 || record >= count || w[0] == 0)) {
        PyErr_Format(PyExc_ValueError, "pixel_publish: record %zd of %zd, word 0 %llu (must not be 0)",
                     record, count, w[0]);
        words = NULL;
    }
    if (words != NULL) {
        uint64_t *entry = words + record * ENTRY_WORDS;
        __atomic_store_n(entry + 1, (uint64_t)w[1], __ATOMIC_RELAXED);
        __atomic_store_n(entry + 2, (uint64_t)w[2], __ATOMIC_RELAXED);
        __atomic_store_n(entry + 3, (uint64_t)w[3], __ATOMIC_RELAXED);
        __atomic_store_n(entry, (uint64_t)w[0], __ATOMIC_RELEASE);
    }
    PyBuffer_Release(&index);
    if (words == NULL) {
        return NULL;
    }
    Py_RETURN_NONE;
}
