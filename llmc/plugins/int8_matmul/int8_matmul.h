/* Block-wise int8 matrix product with int8 activations: the C kernel of llmc::BlockInt8MatMul.
 *
 * y[m, n] = sum_g sa[m, g] * sw[n, g] * sum_{k in block g} qa[m, k] * qw[n, k]
 *
 * where block g holds input channels [g * bs, (g + 1) * bs), qw are the weight's int8 codes
 * (stored as MatMulNBits' 8-bit layout: uint8 with zero point 128), sw its float32 block scales,
 * and qa = round_half_even(a / sa) the activations quantized per row and block on the fly with
 * sa = max |a| / 127 over the block -- what ONNX Runtime's MatMulNBits computes at accuracy
 * level 4 (int8 compute), run here at every M with AVX-512 VNNI (vpdpbusd) where the host has
 * it, and with portable C elsewhere.
 */
#ifndef LLMC_INT8_MATMUL_H
#define LLMC_INT8_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Columns per packed panel and rows per tile of the micro-kernel. */
#define I8MM_PANEL 64
#define I8MM_TILE_ROWS 6
/* Rows per item of the AMX path (two 16-row tiles; the last item of a product may hold one), and
 * the fewest rows of a product that takes it. */
#define I8MM_AMX_ROWS 32
#define I8MM_AMX_MIN_ROWS 16

enum { I8MM_OK = 0, I8MM_BAD_SHAPE = 1, I8MM_NO_MEMORY = 2 };

/* The weight repacked for the micro-kernel (i8mm_pack). */
struct i8mm_weights {
  int64_t k, n, block_size, num_blocks, num_panels;
  int8_t *codes;   /* [num_panels][k / 4][I8MM_PANEL][4]: qw - 128, zero past column n */
  float *scales;   /* [num_panels][num_blocks][I8MM_PANEL]: sw, zero past column n */
  int prefetch;    /* 1: the VNNI tiles prefetch the next panel into L1 in every product
                    * (i8mm_pack: not on AMD, where vnni.c's panel_prefetch chooses) */
};

/* Repack MatMulNBits' 8-bit weight: b [n][k / block_size][block_size] uint8 codes (zero point
 * 128), scales [n][k / block_size] float32. block_size must be a multiple of 4 dividing k.
 * Returns I8MM_OK, I8MM_BAD_SHAPE or I8MM_NO_MEMORY (w then holds nothing to free). */
int i8mm_pack(struct i8mm_weights *w, const uint8_t *b, const float *scales, int64_t k,
              int64_t n, int64_t block_size);
void i8mm_free(struct i8mm_weights *w);

/* What the product reads of A: its rows as they are, or, for a gated MLP's down projection,
 * gelu_tanh(gate) * up of rows [gate | up] (2k floats each; GELU's tanh form, Hendrycks &
 * Gimpel 2016, as Gemma's MLP uses it). */
enum { I8MM_INPUT_PLAIN = 0, I8MM_INPUT_GELU_TANH_GATE = 1 };

/* Quantize rows [m0, m1) of a (float32, [m][k], or [m][2k] with I8MM_INPUT_GELU_TANH_GATE):
 * qa [m][k] int8 codes (round(x / sa), |code| <= 127), sa [m][k / block_size] float32 (a
 * block's amax / 127), and za [m][k / block_size] int32: 128 times the sum of a block's codes
 * (what the VNNI tiles, whose unsigned operand is the weight code + 128, take back); za may be
 * NULL where only the AMX items will read the rows. */
void i8mm_quantize_rows(const struct i8mm_weights *w, const float *a, int input, int64_t m0,
                        int64_t m1, int8_t *qa, float *sa, int32_t *za);

/* gelu_tanh(gate[i]) * up[i] for i < n (the I8MM_INPUT_GELU_TANH_GATE input). */
void i8mm_gelu_tanh_gate(const float *gate, const float *up, int64_t n, float *out);

/* Work items of an m-row product, y [m][n] float32 from rows quantized by i8mm_quantize_rows:
 * panels times tiles of I8MM_TILE_ROWS rows; item i covers panel i / num_tiles and tile
 * i % num_tiles, so consecutive items reuse one weight panel. */
int64_t i8mm_num_items(const struct i8mm_weights *w, int64_t m);
void i8mm_item(const struct i8mm_weights *w, const int8_t *qa, const float *sa,
               const int32_t *za, int64_t m, int64_t item, float *y);

/* The AMX path (Intel AMX-INT8, tdpbssd): 0 when an m-row product does not take it (built
 * without AMX, the host or OS does not grant tile data to this process, m < I8MM_AMX_MIN_ROWS,
 * or a block size that is not a multiple of 64), else the rows it computes: m rounded up to a
 * multiple of I8MM_AMX_MIN_ROWS. The caller then quantizes rows [0, m) with
 * i8mm_quantize_rows into qa [rows][k] and sa [rows][k / block_size] whose rows past m hold
 * zeros, and runs i8mm_amx_num_items items of 32 rows (the last 16 where rows % 32 == 16)
 * x one panel; only rows below m are written to y. The first call asks Linux for the tile
 * registers (arch_prctl), once per process. */
int64_t i8mm_amx_rows(const struct i8mm_weights *w, int64_t m);
int64_t i8mm_amx_num_items(const struct i8mm_weights *w, int64_t rows);
void i8mm_amx_item(const struct i8mm_weights *w, const int8_t *qa, const float *sa, int64_t m,
                   int64_t rows, int64_t item, float *y);

/* The GELU-gated output of a fused [gate | up] weight (n % 128 == 0): y [m][n / 2] =
 * gelu_tanh(x W_gate) * (x W_up), W_gate the first n / 2 columns; items as i8mm_num_items's,
 * each a tile of rows x one gate panel and its up partner. The AMX forms take the rows and codes
 * of the AMX path (i8mm_amx_rows). */
int64_t i8mm_gated_num_items(const struct i8mm_weights *w, int64_t m);
void i8mm_gated_item(const struct i8mm_weights *w, const int8_t *qa, const float *sa,
                     const int32_t *za, int64_t m, int64_t item, float *y);
int64_t i8mm_amx_gated_num_items(const struct i8mm_weights *w, int64_t rows);
void i8mm_amx_gated_item(const struct i8mm_weights *w, const int8_t *qa, const float *sa,
                         int64_t m, int64_t rows, int64_t item, float *y);

#ifdef __cplusplus
}
#endif

#endif
