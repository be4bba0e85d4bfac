/* llmc::BlockInt8MatMul: com.microsoft MatMulNBits with 8-bit weights at accuracy level 4
 * (int8 compute) -- same inputs, attributes and arithmetic -- run by the VNNI tiles of vnni.c
 * at every M (the AMX tiles of amx.c at 16 rows or more where the host grants them). ONNX
 * Runtime's own kernel for it is fast at M = 1 and 3-4x slower than its W8A8 GEMM per FLOP at
 * prefill sizes (benchmarks/RESULTS.md); this one packs the weight once, when the session
 * creates the kernel, and runs tiles of 6 (VNNI) or 16-32 (AMX) rows x 64 columns on ORT's
 * intra-op pool.
 *
 * Inputs: A float32 [..., K]; B uint8 [N, K / block_size, block_size] (codes, zero point 128)
 * and scales float32 [N * K / block_size], both constant initializers. Attributes: K, N,
 * block_size (bits must be 8; accuracy_level is ignored: always int8 compute), and optional
 * input_gate: "" (A is the product's input) or "gelu_tanh" (A is [..., 2K] = [gate | up] of a
 * gated MLP and the product's input is gelu_tanh(gate) * up, computed as the rows are
 * quantized: the down projection then reads the gate/up projection's output once, with no
 * Split, Gelu and Mul between); and output_gate: "" (Y is [..., N]) or "gelu_tanh" (the weight
 * is a gated MLP's fused [gate | up] projection, N % 128 == 0, and Y is [..., N / 2] =
 * gelu_tanh(gate) * up, computed per tile: half the output written and read). Output Y float32.
 * A non-constant weight, a bad shape or attribute fails with ORT_INVALID_ARGUMENT.
 */
#include "ort_matmul.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "int8_matmul.h"
#include "ort_custom_op.h"

static const OrtApi *ort;

enum { IN_A, IN_B, IN_SCALES, N_IN };

struct kernel {
  struct i8mm_weights w;
  int input;       /* I8MM_INPUT_* */
  int output_gate; /* 1: Y = gelu_tanh(gate) * up of the two halves of N */
};

#define fail(...) llmc_op_fail(ort, __VA_ARGS__)

/* A string attribute that may be absent ("" then) or "gelu_tanh"; 1 for "gelu_tanh". */
static OrtStatus *gate_attribute(const OrtKernelInfo *info, const char *name, int *gelu) {
  char gate[16] = "";
  size_t size = sizeof gate;
  OrtStatus *status = ort->KernelInfoGetAttribute_string(info, name, gate, &size);
  if (status != NULL) { /* optional, none */
    ort->ReleaseStatus(status);
    gate[0] = '\0';
  }
  *gelu = strcmp(gate, "gelu_tanh") == 0;
  if (!*gelu && gate[0] != '\0')
    return fail("BlockInt8MatMul: %s must be \"\" or \"gelu_tanh\", got \"%s\"", name, gate);
  return NULL;
}


/* ---- Kernel: the packed weight ------------------------------------------------------------- */

static OrtStatus *constant_input(const OrtKernelInfo *info, int index, const char *name,
                                 ONNXTensorElementDataType type, size_t count,
                                 const void **data) {
  int is_constant = 0;
  const OrtValue *value = NULL;
  LLMC_TRY(ort->KernelInfoGetConstantInput_tensor(info, (size_t)index, &is_constant, &value));
  if (!is_constant || value == NULL)
    return fail("BlockInt8MatMul: %s must be a constant initializer", name);
  OrtTensorTypeAndShapeInfo *shape;
  LLMC_TRY(ort->GetTensorTypeAndShape(value, &shape));
  ONNXTensorElementDataType got;
  size_t elements = 0;
  OrtStatus *status = ort->GetTensorElementType(shape, &got);
  if (status == NULL) status = ort->GetTensorShapeElementCount(shape, &elements);
  ort->ReleaseTensorTypeAndShapeInfo(shape);
  if (status != NULL) return status;
  if (got != type || elements != count)
    return fail("BlockInt8MatMul: %s must hold %zu elements of ONNX type %d, got %zu of %d", name,
                count, (int)type, elements, (int)got);
  return ort->GetTensorMutableData((OrtValue *)value, (void **)data);
}

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api,
                                             const OrtKernelInfo *info, void **out) {
  (void)op;
  (void)api;
  int64_t k, n, block_size, bits = 8;
  LLMC_TRY(ort->KernelInfoGetAttribute_int64(info, "K", &k));
  LLMC_TRY(ort->KernelInfoGetAttribute_int64(info, "N", &n));
  LLMC_TRY(ort->KernelInfoGetAttribute_int64(info, "block_size", &block_size));
  OrtStatus *status = ort->KernelInfoGetAttribute_int64(info, "bits", &bits);
  if (status != NULL) ort->ReleaseStatus(status); /* optional, 8 */
  int input_gelu, output_gate;
  LLMC_TRY(gate_attribute(info, "input_gate", &input_gelu));
  LLMC_TRY(gate_attribute(info, "output_gate", &output_gate));
  int input = input_gelu ? I8MM_INPUT_GELU_TANH_GATE : I8MM_INPUT_PLAIN;
  if (output_gate && n % 128 != 0)
    return fail("BlockInt8MatMul: output_gate needs N a multiple of 128, got N=%lld",
                (long long)n);
  if (bits != 8 || k < 1 || n < 1 || block_size < 4 || block_size % 4 != 0 ||
      k % block_size != 0) {
    return fail("BlockInt8MatMul: needs bits=8 and a block_size that is a multiple of 4 "
                "dividing K; got bits=%lld K=%lld N=%lld block_size=%lld", (long long)bits,
                (long long)k, (long long)n, (long long)block_size);
  }
  const void *b, *scales;
  LLMC_TRY(constant_input(info, IN_B, "B", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, (size_t)(n * k),
                          &b));
  LLMC_TRY(constant_input(info, IN_SCALES, "scales", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                          (size_t)(n * (k / block_size)), &scales));
  struct kernel *kernel = malloc(sizeof *kernel);
  if (kernel == NULL) return ort->CreateStatus(ORT_FAIL, "BlockInt8MatMul: out of memory");
  if (i8mm_pack(&kernel->w, b, scales, k, n, block_size) != I8MM_OK) {
    free(kernel);
    return ort->CreateStatus(ORT_FAIL, "BlockInt8MatMul: out of memory packing the weight");
  }
  kernel->input = input;
  kernel->output_gate = output_gate;
  *out = kernel;
  return NULL;
}

static void ORT_API_CALL destroy_kernel(void *state) {
  struct kernel *kernel = state;
  i8mm_free(&kernel->w);
  free(kernel);
}

/* ---- Compute: quantize rows, then tiles, both on ORT's pool -------------------------------- */

struct job {
  const struct i8mm_weights *w;
  int input;
  const float *a;
  int8_t *qa;
  float *sa, *y;
  int32_t *za;
  int64_t m, tasks;
  int64_t quantize_tasks; /* <= m: a one-row decode step quantizes its row without the pool */
  int64_t amx_rows; /* rows the AMX path computes (i8mm_amx_rows), 0: the VNNI tiles */
  int output_gate;  /* y [m][n / 2] = gelu_tanh(gate) * up */
};

/* Task t of j->quantize_tasks quantizes a contiguous range of rows. */
static void quantize_task(void *data, size_t task) {
  const struct job *j = data;
  int64_t m0 = j->m * (int64_t)task / j->quantize_tasks;
  int64_t m1 = j->m * ((int64_t)task + 1) / j->quantize_tasks;
  i8mm_quantize_rows(j->w, j->a, j->input, m0, m1, j->qa, j->sa, j->za);
}

static int64_t num_items(const struct job *j) {
  if (j->amx_rows > 0)
    return j->output_gate ? i8mm_amx_gated_num_items(j->w, j->amx_rows)
                          : i8mm_amx_num_items(j->w, j->amx_rows);
  return j->output_gate ? i8mm_gated_num_items(j->w, j->m) : i8mm_num_items(j->w, j->m);
}

static void run_item(const struct job *j, int64_t i) {
  if (j->amx_rows > 0 && j->output_gate)
    i8mm_amx_gated_item(j->w, j->qa, j->sa, j->m, j->amx_rows, i, j->y);
  else if (j->amx_rows > 0)
    i8mm_amx_item(j->w, j->qa, j->sa, j->m, j->amx_rows, i, j->y);
  else if (j->output_gate)
    i8mm_gated_item(j->w, j->qa, j->sa, j->za, j->m, i, j->y);
  else
    i8mm_item(j->w, j->qa, j->sa, j->za, j->m, i, j->y);
}

/* Task t of j->tasks runs a contiguous range of items: whole weight panels per thread, so a
 * panel is read from memory once (a vocabulary projection's weight is far larger than L2). */
static void tile_task(void *data, size_t task) {
  const struct job *j = data;
  int64_t items = num_items(j);
  int64_t i0 = items * (int64_t)task / j->tasks, i1 = items * ((int64_t)task + 1) / j->tasks;
  for (int64_t i = i0; i < i1; ++i) run_item(j, i);
}

static OrtStatus *ORT_API_CALL compute(void *kernel_state, OrtKernelContext *context) {
  const struct kernel *kernel = kernel_state;
  const struct i8mm_weights *w = &kernel->w;
  const int64_t width = kernel->input == I8MM_INPUT_GELU_TANH_GATE ? 2 * w->k : w->k;
  const OrtValue *a_value;
  LLMC_TRY(ort->KernelContext_GetInput(context, IN_A, &a_value));
  OrtTensorTypeAndShapeInfo *info;
  LLMC_TRY(ort->GetTensorTypeAndShape(a_value, &info));
  size_t rank = 0;
  int64_t dims[8];
  OrtStatus *status = ort->GetDimensionsCount(info, &rank);
  if (status == NULL && (rank < 1 || rank > 8))
    status = fail("BlockInt8MatMul: A must have rank 1 to 8, got %zu", rank);
  if (status == NULL) status = ort->GetDimensions(info, dims, rank);
  ort->ReleaseTensorTypeAndShapeInfo(info);
  if (status != NULL) return status;
  if (dims[rank - 1] != width)
    return fail("BlockInt8MatMul: A's last dimension must be %lld (K=%lld%s), got %lld",
                (long long)width, (long long)w->k, width != w->k ? ", gated: 2K" : "",
                (long long)dims[rank - 1]);
  int64_t m = 1;
  for (size_t i = 0; i + 1 < rank; ++i) m *= dims[i];
  dims[rank - 1] = kernel->output_gate ? w->n / 2 : w->n;
  OrtValue *y_value;
  LLMC_TRY(ort->KernelContext_GetOutput(context, 0, dims, rank, &y_value));
  float *y;
  const float *a;
  LLMC_TRY(ort->GetTensorMutableData(y_value, (void **)&y));
  LLMC_TRY(ort->GetTensorMutableData((OrtValue *)a_value, (void **)&a));
  if (m == 0) return NULL;

  /* The AMX path computes whole 16-row tiles: rows past m are zero codes with zero scales. */
  int64_t amx_rows = i8mm_amx_rows(w, m), rows = amx_rows > 0 ? amx_rows : m;
  int8_t *qa = malloc((size_t)(rows * w->k));
  float *sa = malloc((size_t)(rows * w->num_blocks) * sizeof *sa);
  int32_t *za = malloc((size_t)(rows * w->num_blocks) * sizeof *za);
  if (qa == NULL || sa == NULL || za == NULL) {
    free(qa);
    free(sa);
    free(za);
    return ort->CreateStatus(ORT_FAIL, "BlockInt8MatMul: out of memory");
  }
  memset(qa + m * w->k, 0, (size_t)((rows - m) * w->k));
  memset(sa + m * w->num_blocks, 0, (size_t)((rows - m) * w->num_blocks) * sizeof *sa);
  long cpus = llmc_op_cpus();
  struct job job = {w, kernel->input, a, qa, sa, y, za, m, 1, 1, amx_rows, kernel->output_gate};
  int64_t items = num_items(&job);
  job.tasks = cpus < items ? cpus : items;
  job.quantize_tasks = cpus < m ? cpus : m;
  llmc_op_parallel_for(ort, context, quantize_task, (size_t)job.quantize_tasks, &job);
  llmc_op_parallel_for(ort, context, tile_task, (size_t)job.tasks, &job);
  free(qa);
  free(sa);
  free(za);
  return NULL;
}

/* ---- The op --------------------------------------------------------------------------------- */

static const ONNXTensorElementDataType INPUT_TYPES[N_IN] = {
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};

static struct llmc_op block_int8_matmul_op = {
    .name = "BlockInt8MatMul",
    .num_inputs = N_IN,
    .num_outputs = 1,
    .input_types = INPUT_TYPES,
    .create = create_kernel,
    .compute = compute,
    .destroy = destroy_kernel,
};

const OrtCustomOp *llmc_block_int8_matmul_op(const OrtApi *api) {
  ort = api;
  return llmc_op_define(&block_int8_matmul_op);
}
