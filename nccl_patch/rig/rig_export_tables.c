/* The CUDA runtime's private export tables (cuGetExportTable). NVIDIA does not document them;
 * their ids, slot meanings and what a slot must return are facts published by projects that
 * replace the driver (ZLUDA's dark_api, Wine's nvcuda). The rig answers the slots the runtime
 * linked into libnccl uses; any other slot names its table and index when called. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rig_internal.h"

enum nbxTable {
  TABLE_CUDART_INTERFACE,
  TABLE_TOOLS_TLS,
  TABLE_TOOLS_CALLBACKS,
  TABLE_CONTEXT_STORAGE,
  TABLE_CTX_CREATE_BYPASS,
  TABLE_HEAP_ACCESS,
  TABLE_DEVICE_EXTENDED,
  TABLE_INTEGRITY_CHECK,
  TABLE_CONTEXT_CHECKS,
  TABLE_COUNT
};

static const struct {
  const char *name;
  unsigned char id[16];
  int slots;
  int sizeInSlot0; /* slot 0 holds the table's size in bytes */
} tables[TABLE_COUNT] = {
    [TABLE_CUDART_INTERFACE] = {"cudart interface",
                                {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9},
                                13, 1},
    [TABLE_TOOLS_TLS] = {"tools TLS",
                         {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc},
                         4, 1},
    [TABLE_TOOLS_CALLBACKS] = {"tools runtime callback hooks",
                               {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66},
                               7, 1},
    [TABLE_CONTEXT_STORAGE] = {"context local storage",
                               {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93},
                               4, 0},
    [TABLE_CTX_CREATE_BYPASS] = {"context create bypass",
                                 {0x0c, 0xa5, 0x0b, 0x8c, 0x10, 0x04, 0x92, 0x9a, 0x89, 0xa7, 0xd0, 0xdf, 0x10, 0xe7, 0x72, 0x86},
                                 2, 1},
    [TABLE_HEAP_ACCESS] = {"heap access",
                           {0x19, 0x5b, 0xcb, 0xf4, 0xd6, 0x7d, 0x02, 0x4a, 0xac, 0xc5, 0x1d, 0x29, 0xce, 0xa6, 0x31, 0xae},
                           3, 1},
    [TABLE_DEVICE_EXTENDED] = {"device extended runtime",
                               {0xb1, 0x05, 0x41, 0xe1, 0xf7, 0xc7, 0xc7, 0x4a, 0x9f, 0x64, 0xf2, 0x23, 0xbe, 0x99, 0xf1, 0xe2},
                               26, 1},
    [TABLE_INTEGRITY_CHECK] = {"integrity check",
                               {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2},
                               3, 1},
    [TABLE_CONTEXT_CHECKS] = {"context checks",
                              {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e},
                              4, 1},
};

/* The probe whose success would let the runtime skip its usual bootstrap: the rig has no such path. */
static const unsigned char bootstrapProbe[16] = {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e,
                                                 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9};

static CUresult missingSlot(int table, int slot) {
  nbxLog("slot %d of the runtime's private export table \"%s\" is not implemented by the rig's CUDA driver", slot,
         tables[table].name);
  return CUDA_ERROR_NOT_SUPPORTED;
}

#define SLOT_STUB(t, i) \
  static CUresult missing_##t##_##i(void) { return missingSlot(t, i); }
#define SLOT_STUBS(t)                                                                                                  \
  SLOT_STUB(t, 0) SLOT_STUB(t, 1) SLOT_STUB(t, 2) SLOT_STUB(t, 3) SLOT_STUB(t, 4) SLOT_STUB(t, 5) SLOT_STUB(t, 6)     \
  SLOT_STUB(t, 7) SLOT_STUB(t, 8) SLOT_STUB(t, 9) SLOT_STUB(t, 10) SLOT_STUB(t, 11) SLOT_STUB(t, 12)                  \
  SLOT_STUB(t, 13) SLOT_STUB(t, 14) SLOT_STUB(t, 15) SLOT_STUB(t, 16) SLOT_STUB(t, 17) SLOT_STUB(t, 18)               \
  SLOT_STUB(t, 19) SLOT_STUB(t, 20) SLOT_STUB(t, 21) SLOT_STUB(t, 22) SLOT_STUB(t, 23) SLOT_STUB(t, 24)               \
  SLOT_STUB(t, 25)
#define SLOT_ROW(t)                                                                                                    \
  {(void *)missing_##t##_0,  (void *)missing_##t##_1,  (void *)missing_##t##_2,  (void *)missing_##t##_3,            \
   (void *)missing_##t##_4,  (void *)missing_##t##_5,  (void *)missing_##t##_6,  (void *)missing_##t##_7,            \
   (void *)missing_##t##_8,  (void *)missing_##t##_9,  (void *)missing_##t##_10, (void *)missing_##t##_11,           \
   (void *)missing_##t##_12, (void *)missing_##t##_13, (void *)missing_##t##_14, (void *)missing_##t##_15,           \
   (void *)missing_##t##_16, (void *)missing_##t##_17, (void *)missing_##t##_18, (void *)missing_##t##_19,           \
   (void *)missing_##t##_20, (void *)missing_##t##_21, (void *)missing_##t##_22, (void *)missing_##t##_23,           \
   (void *)missing_##t##_24, (void *)missing_##t##_25}
SLOT_STUBS(0) SLOT_STUBS(1) SLOT_STUBS(2) SLOT_STUBS(3) SLOT_STUBS(4) SLOT_STUBS(5) SLOT_STUBS(6) SLOT_STUBS(7)
SLOT_STUBS(8)

static void *slots[TABLE_COUNT][26] = {SLOT_ROW(0), SLOT_ROW(1), SLOT_ROW(2), SLOT_ROW(3), SLOT_ROW(4),
                                       SLOT_ROW(5), SLOT_ROW(6), SLOT_ROW(7), SLOT_ROW(8)};

/* ---- cudart interface ---- */

/* Loading the runtime's embedded fatbins: the rig does not read the device code (the kernels are
 * CPU code), so a module is an empty namespace that functions and globals are looked up in. */
static CUresult moduleFromFatbin(CUmodule *out) {
  extern CUresult nbxModuleNew(CUmodule *out);
  return nbxModuleNew(out);
}

static CUresult cudartModuleFromCubin(CUmodule *out, const void *wrapper) {
  (void)wrapper;
  return moduleFromFatbin(out);
}

static CUresult cudartPrimaryContext(CUcontext *ctx, CUdevice d) {
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = &nbxPrimaryContext;
  return CUDA_SUCCESS;
}

static CUresult cudartModuleFromCubinExt1(CUmodule *out, const void *wrapper, void *a3, void *a4, unsigned a5) {
  (void)wrapper;
  (void)a3;
  (void)a4;
  (void)a5;
  return moduleFromFatbin(out);
}

static void cudartSlot7(uintptr_t arg) { (void)arg; }

static CUresult cudartModuleFromCubinExt2(const void *header, CUmodule *out, void *a3, void *a4, unsigned a5) {
  (void)header;
  (void)a3;
  (void)a4;
  (void)a5;
  return moduleFromFatbin(out);
}

static CUresult cudartLoadCompilers(void) { return CUDA_SUCCESS; }

/* ---- tools callback hooks: two buffers the runtime writes into ---- */

static uint32_t hookBuffer1[1024], hookBuffer2[14];
static void toolsBuffer1(void **ptr, size_t *size) {
  *ptr = hookBuffer1;
  *size = sizeof(hookBuffer1) / sizeof(hookBuffer1[0]);
}
static void toolsBuffer2(void **ptr, size_t *size) {
  *ptr = hookBuffer2;
  *size = sizeof(hookBuffer2) / sizeof(hookBuffer2[0]);
}

/* ---- context-local storage ---- */

static pthread_mutex_t storageLock = PTHREAD_MUTEX_INITIALIZER;

static CUresult storagePut(CUcontext ctx, void *key, void *value, void *destructor) {
  (void)ctx;
  (void)destructor; /* the primary context is never reset while the process runs */
  struct nbxContext *c = &nbxPrimaryContext;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&storageLock);
  int i = 0;
  while (i < c->nStorage && c->storage[i].key != key) i++;
  if (i == c->nStorage) {
    if (c->nStorage == (int)(sizeof(c->storage) / sizeof(c->storage[0]))) r = CUDA_ERROR_OUT_OF_MEMORY;
    else c->nStorage++;
  }
  if (r == CUDA_SUCCESS) {
    c->storage[i].key = key;
    c->storage[i].value = value;
  }
  pthread_mutex_unlock(&storageLock);
  return r;
}

static CUresult storageDelete(CUcontext ctx, void *key) {
  (void)ctx;
  struct nbxContext *c = &nbxPrimaryContext;
  pthread_mutex_lock(&storageLock);
  for (int i = 0; i < c->nStorage; i++)
    if (c->storage[i].key == key) {
      c->storage[i] = c->storage[--c->nStorage];
      break;
    }
  pthread_mutex_unlock(&storageLock);
  return CUDA_SUCCESS;
}

static CUresult storageGet(void **value, CUcontext ctx, void *key) {
  (void)ctx;
  struct nbxContext *c = &nbxPrimaryContext;
  CUresult r = CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&storageLock);
  for (int i = 0; i < c->nStorage; i++)
    if (c->storage[i].key == key) {
      *value = c->storage[i].value;
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&storageLock);
  return r;
}

/* ---- context checks ---- */

static CUresult contextCheck(CUcontext ctx, uint32_t *result, const void **unused) {
  (void)ctx;
  (void)unused;
  if (result) *result = 0;
  return CUDA_SUCCESS;
}
static uint32_t contextCheck3(void) { return 0; }

/* ---- integrity check (rig_integrity.c) ---- */

struct deviceFacts {
  CUuuid uuid;
  int32_t pciDomain, pciBus, pciDevice;
};
CUresult nbxIntegrityDigest(uint32_t version, uint64_t unixSeconds, uint64_t result[2], const void *cudartTable,
                            const void *integrityTable, const void *function, const struct deviceFacts *device);
CUresult nbxDeviceFacts(CUuuid *uuid, int *domain, int *bus, int *device);

static CUresult integrityCheck(uint32_t version, uint64_t unixSeconds, uint64_t result[2]) {
  if (result == NULL) return CUDA_ERROR_INVALID_VALUE;
  struct deviceFacts device;
  memset(&device, 0, sizeof(device));
  CUresult r = nbxDeviceFacts(&device.uuid, &device.pciDomain, &device.pciBus, &device.pciDevice);
  if (r != CUDA_SUCCESS) return r;
  return nbxIntegrityDigest(version, unixSeconds, result, slots[TABLE_CUDART_INTERFACE], slots[TABLE_INTEGRITY_CHECK],
                            (const void *)integrityCheck, &device);
}

static pthread_once_t tablesOnce = PTHREAD_ONCE_INIT;

static void fillTables(void) {
  for (int t = 0; t < TABLE_COUNT; t++)
    if (tables[t].sizeInSlot0) slots[t][0] = (void *)(uintptr_t)(tables[t].slots * sizeof(void *));
  slots[TABLE_CUDART_INTERFACE][1] = (void *)cudartModuleFromCubin;
  slots[TABLE_CUDART_INTERFACE][2] = (void *)cudartPrimaryContext;
  slots[TABLE_CUDART_INTERFACE][6] = (void *)cudartModuleFromCubinExt1;
  slots[TABLE_CUDART_INTERFACE][7] = (void *)cudartSlot7;
  slots[TABLE_CUDART_INTERFACE][8] = (void *)cudartModuleFromCubinExt2;
  slots[TABLE_CUDART_INTERFACE][12] = (void *)cudartLoadCompilers;
  slots[TABLE_TOOLS_CALLBACKS][2] = (void *)toolsBuffer1;
  slots[TABLE_TOOLS_CALLBACKS][6] = (void *)toolsBuffer2;
  slots[TABLE_CONTEXT_STORAGE][0] = (void *)storagePut;
  slots[TABLE_CONTEXT_STORAGE][1] = (void *)storageDelete;
  slots[TABLE_CONTEXT_STORAGE][2] = (void *)storageGet;
  slots[TABLE_INTEGRITY_CHECK][1] = (void *)integrityCheck;
  slots[TABLE_CONTEXT_CHECKS][2] = (void *)contextCheck;
  slots[TABLE_CONTEXT_CHECKS][3] = (void *)contextCheck3;
}

CUresult nbxGetExportTable(const void **table, const CUuuid *id) {
  if (table == NULL || id == NULL) return CUDA_ERROR_INVALID_VALUE;
  pthread_once(&tablesOnce, fillTables);
  if (memcmp(id->bytes, bootstrapProbe, 16) == 0) return CUDA_ERROR_NOT_FOUND;
  for (int t = 0; t < TABLE_COUNT; t++)
    if (memcmp(id->bytes, tables[t].id, 16) == 0) {
      if (nbxDebug()) nbxLog("export table \"%s\"", tables[t].name);
      *table = slots[t];
      return CUDA_SUCCESS;
    }
  char hex[33];
  for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", id->bytes[i]);
  nbxLog("the runtime asked for private export table %s, which the rig's CUDA driver does not know", hex);
  return CUDA_ERROR_NOT_FOUND;
}
