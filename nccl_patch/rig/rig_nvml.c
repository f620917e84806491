/* The rig's NVML (libnvidia-ml.so.1): the one device NCCL's topology asks about. It reports an
 * sm_80 GPU with no NVLink, no P2P, no fabric and no confidential computing; NCCL then connects
 * every peer through its NET transport. Return codes restated from NVIDIA's nvml.h. */
#include <stdio.h>
#include <string.h>

#define NBX_EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct nbxNvmlDevice *nvmlDevice_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6 };
enum { NVML_P2P_STATUS_NOT_SUPPORTED = 5 };

struct nbxNvmlDevice { int index; };
static struct nbxNvmlDevice theDevice = {0};

NBX_EXPORT nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
NBX_EXPORT nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
NBX_EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

NBX_EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
  case NVML_SUCCESS: return "Success";
  case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
  case NVML_ERROR_NOT_SUPPORTED: return "Not Supported (NeuronaBox rig)";
  case NVML_ERROR_NOT_FOUND: return "Not Found";
  default: return "Unknown Error";
  }
}

NBX_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) {
  if (n == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *n = 1;
  return NVML_SUCCESS;
}
NBX_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned *n) { return nvmlDeviceGetCount_v2(n); }

NBX_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned index, nvmlDevice_t *device) {
  if (device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  if (index != 0) return NVML_ERROR_NOT_FOUND;
  *device = &theDevice;
  return NVML_SUCCESS;
}
NBX_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device) {
  return nvmlDeviceGetHandleByIndex(index, device);
}

NBX_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *busId, nvmlDevice_t *device) {
  if (busId == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &theDevice; /* one device: every bus id NCCL asks about is the rig's */
  return NVML_SUCCESS;
}
NBX_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *busId, nvmlDevice_t *device) {
  return nvmlDeviceGetHandleByPciBusId(busId, device);
}

NBX_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned *index) {
  if (device == NULL || index == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *index = (unsigned)device->index;
  return NVML_SUCCESS;
}

NBX_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
  if (device == NULL || major == NULL || minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *major = 8; /* as the rig's CUDA driver reports */
  *minor = 0;
  return NVML_SUCCESS;
}

NBX_EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status) {
  (void)a;
  (void)b;
  (void)index;
  if (status == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *status = NVML_P2P_STATUS_NOT_SUPPORTED;
  return NVML_SUCCESS;
}

/* No NVLink: every link query is unsupported, which NCCL reads as "no link". */
NBX_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned link, int *active) {
  (void)d;
  (void)link;
  (void)active;
  return NVML_ERROR_NOT_SUPPORTED;
}
NBX_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t d, unsigned link, void *pci) {
  (void)d;
  (void)link;
  (void)pci;
  return NVML_ERROR_NOT_SUPPORTED;
}
NBX_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned link, void *pci) {
  return nvmlDeviceGetNvLinkRemotePciInfo(d, link, pci);
}
NBX_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t d, unsigned link, int cap, unsigned *result) {
  (void)d;
  (void)link;
  (void)cap;
  (void)result;
  return NVML_ERROR_NOT_SUPPORTED;
}
NBX_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, void *values) {
  (void)d;
  (void)count;
  (void)values;
  return NVML_ERROR_NOT_SUPPORTED;
}
NBX_EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t d, void *info) {
  (void)d;
  (void)info;
  return NVML_ERROR_NOT_SUPPORTED;
}
NBX_EXPORT nvmlReturn_t nvmlDeviceGetPlatformInfo(nvmlDevice_t d, void *info) {
  (void)d;
  (void)info;
  return NVML_ERROR_NOT_SUPPORTED;
}
NBX_EXPORT nvmlReturn_t nvmlSystemGetConfComputeState(void *state) {
  (void)state;
  return NVML_ERROR_NOT_SUPPORTED;
}
NBX_EXPORT nvmlReturn_t nvmlSystemGetConfComputeSettings(void *settings) {
  (void)settings;
  return NVML_ERROR_NOT_SUPPORTED;
}
