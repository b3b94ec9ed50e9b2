/* The pixel cache fill's resize (fill_resize.c): a whole decoded image shrunk to its stored size
 * row by row as the decoder hands rows over, in 14-bit fixed point. */
#ifndef FASTLOAD_FILL_RESIZE_H
#define FASTLOAD_FILL_RESIZE_H

#include <stddef.h>
#include <stdint.h>

#define FILL_BITS 14 /* the weights' fixed point: they sum to 1 << FILL_BITS */

/* Bytes a row handed to fastload_fill_columns must have readable past its last pixel. */
#define FILL_READ_PAST 32

/* One axis of the fill's resize, the span [in0, in1) of in_size pixels to out_size, Pillow's
 * bilinear (triangle) filter stretched by the reduction, each output pixel's window as Pillow's
 * resize(box=) gives it: output pixel i reads input pixels first[i] to first[i] +
 * count[i] - 1 with weights[i * taps ...] (zeros past its count); lanes: the same weights
 * as the columns pass's AVX2 code reads them, 16 per group of four taps. */
typedef struct {
    int in_size, out_size, taps, max_count; /* taps: max_count rounded up to whole groups of 4 */
    int begin, end;                         /* every input pixel read lies in [begin, end) */
    int *first, *count;
    int16_t *weights, *lanes;
} FillAxis;

/* The axis (with lanes when asked: a columns pass's); 0 when out of memory (nothing to free) or 1
 * (free with fastload_fill_axis_free). */
int fastload_fill_axis(FillAxis *axis, int in_size, double in0, double in1, int out_size,
                       int lanes);
void fastload_fill_axis_free(FillAxis *axis);

/* Output row i of the rows pass: rows[t] is input row y->first[i] + t, each row_bytes long. */
void fastload_fill_rows(const FillAxis *y, int i, const unsigned char *const *rows,
                        size_t row_bytes, unsigned char *out);

/* The columns pass on one RGB row of x->in_size pixels (FILL_READ_PAST bytes readable past it)
 * into out, x->out_size packed RGB pixels. */
void fastload_fill_columns(const FillAxis *x, const unsigned char *row, unsigned char *out);

#endif
