/* The pixel cache's resize (fill_resize.c), one plane of bytes at a time: a decoded plane shrunk
 * to its stored size row by row as the decoder hands rows over, and a crop's box of a stored
 * plane resized to the output, in 14-bit fixed point. */
#ifndef FASTLOAD_FILL_RESIZE_H
#define FASTLOAD_FILL_RESIZE_H

#include <stddef.h>
#include <stdint.h>

#define FILL_BITS 14 /* the weights' fixed point: they sum to 1 << FILL_BITS */
#define FILL_HALF (1 << (FILL_BITS - 1))

/* One axis of the resize, the span [in0, in1) of in_size pixels to out_size, Pillow's bilinear
 * (triangle) filter stretched by the reduction, each output pixel's window as Pillow's
 * resize(box=) gives it: output pixel i reads input pixels first[i] to first[i] + count[i] - 1
 * with weights[i * taps ...] (zeros past its count, up to taps). */
typedef struct {
    int in_size, out_size, taps, max_count; /* taps: 4, or max_count rounded up to groups of 8 */
    int begin, end;                         /* every input pixel read lies in [begin, end) */
    int *first, *count;
    int16_t *weights;
    int *windows;            /* fastload_fill_columns_ready's, per four output pixels */
    unsigned char *shuffles;
} FillAxis;

/* The axis; 0 when out of memory (nothing to free) or 1 (free with fastload_fill_axis_free). */
int fastload_fill_axis(FillAxis *axis, int in_size, double in0, double in1, int out_size);
void fastload_fill_axis_free(FillAxis *axis);

/* Output row i of the rows pass: rows[t] is input row y->first[i] + t, each row_bytes long. */
void fastload_fill_rows(const FillAxis *y, int i, const unsigned char *const *rows,
                        size_t row_bytes, unsigned char *out);

/* Ready a columns pass's axis (its first[] as they will be read) for the fastest AVX2 code: for
 * each four output pixels, the 16 bytes of a row that hold all they read, and the byte shuffles
 * that spread them over their taps. readable: bytes of every row that may be read (in_size and
 * taps more, at least). 0 when out of memory (the axis still works, more slowly). */
int fastload_fill_columns_ready(FillAxis *x, size_t readable);

/* The columns pass on one row of x->in_size bytes (x->taps more readable past it: the AVX2 code
 * reads whole groups of taps) into out, x->out_size bytes. */
void fastload_fill_columns(const FillAxis *x, const unsigned char *row, unsigned char *out);

#endif
