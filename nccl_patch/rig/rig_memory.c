/* Device memory is host memory. Every allocation (device, pinned host, registered host) is kept
 * in a registry so pointer queries (cuMemGetAddressRange, cuPointerGetAttribute) can answer. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "rig_internal.h"

struct nbxAllocation {
  char *base;
  size_t bytes;
  size_t mapped; /* bytes mmap'ed (0 for registered host memory, which the caller owns) */
  enum nbxMemKind kind;
  uint64_t id;
  struct nbxAllocation *next;
};

static pthread_mutex_t registryLock = PTHREAD_MUTEX_INITIALIZER;
static struct nbxAllocation *registry;
static uint64_t nextId = 1;

static size_t pageRound(size_t bytes) {
  const size_t page = 4096;
  return bytes == 0 ? page : (bytes + page - 1) / page * page;
}

/* Lists a filled-in allocation under a fresh id. */
static void list(struct nbxAllocation *a) {
  pthread_mutex_lock(&registryLock);
  a->id = nextId++;
  a->next = registry;
  registry = a;
  pthread_mutex_unlock(&registryLock);
}

void *nbxMemAllocate(size_t bytes, enum nbxMemKind kind) {
  size_t mapped = pageRound(bytes);
  /* Fresh anonymous pages: zeroed, as NCCL's buffers need nothing else, and untouched pages cost nothing. */
  void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  struct nbxAllocation *a = calloc(1, sizeof(*a));
  if (a == NULL) {
    munmap(p, mapped);
    return NULL;
  }
  a->base = p;
  a->bytes = bytes;
  a->mapped = mapped;
  a->kind = kind;
  list(a);
  return p;
}

int nbxMemRegister(void *ptr, size_t bytes) { return nbxMemRegisterKind(ptr, bytes, NBX_MEM_HOST_REGISTERED); }

/* Memory the caller owns (registered host memory, VMM mappings): the registry never unmaps it. */
int nbxMemRegisterKind(void *ptr, size_t bytes, enum nbxMemKind kind) {
  struct nbxAllocation *a = calloc(1, sizeof(*a));
  if (a == NULL) return -1;
  a->base = ptr;
  a->bytes = bytes;
  a->kind = kind;
  list(a);
  return 0;
}

int nbxMemRelease(void *ptr, enum nbxMemKind kind) {
  pthread_mutex_lock(&registryLock);
  struct nbxAllocation **link = &registry;
  while (*link != NULL && !((*link)->base == ptr && (*link)->kind == kind)) link = &(*link)->next;
  struct nbxAllocation *a = *link;
  if (a != NULL) *link = a->next;
  pthread_mutex_unlock(&registryLock);
  if (a == NULL) return -1;
  if (a->mapped) munmap(a->base, a->mapped);
  free(a);
  return 0;
}

int nbxMemLookup(const void *ptr, void **base, size_t *bytes, enum nbxMemKind *kind, uint64_t *id) {
  const char *p = ptr;
  int found = 0;
  pthread_mutex_lock(&registryLock);
  for (struct nbxAllocation *a = registry; a != NULL; a = a->next) {
    size_t extent = a->bytes ? a->bytes : 1;
    if (p >= a->base && p < a->base + extent) {
      if (base) *base = a->base;
      if (bytes) *bytes = a->bytes;
      if (kind) *kind = a->kind;
      if (id) *id = a->id;
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&registryLock);
  return found;
}
