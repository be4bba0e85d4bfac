/* Intel AMX for llmc's CPU kernels: asking Linux for the tile registers, and the one tile
 * configuration every kernel uses. Include only where the compiler targets AMX (__AMX_TILE__).
 * Method: Intel's AMX programming reference (CPUID leaf 7, ldtilecfg) and Linux's xstate
 * documentation (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA). */
#ifndef LLMC_AMX_TILES_H
#define LLMC_AMX_TILES_H

#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* CPUID.(EAX=7, ECX=0):EDX feature bits. */
#define LLMC_AMX_BF16 (1u << 22)
#define LLMC_AMX_TILE (1u << 24)
#define LLMC_AMX_INT8 (1u << 25)

/* Whether the CPU has every feature of edx_bits and Linux grants this process the tile data.
 * Why ask: without the grant the first tile instruction faults. Call once per process (each
 * kernel keeps the answer behind a pthread_once). */
static inline int llmc_amx_request(unsigned edx_bits) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return 0;
  if ((edx & edx_bits) != edx_bits) return 0;
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

/* Palette 1 with tiles 0-7 of 16 rows x 64 bytes. The configuration is per thread and another
 * library (MLAS) may load its own between two calls: load it at the start of each work item. */
static inline void llmc_amx_configure(void) {
  struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
  } __attribute__((packed, aligned(64))) config;
  memset(&config, 0, sizeof config);
  config.palette = 1;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

#endif
